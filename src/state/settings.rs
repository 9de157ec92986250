//! What `[state]` means, compiled: where the fleet's security state lives.
//!
//! Place in the path: built once by the configuration loader (which only
//! imports these types) and read at start, when the store is set up.
//!
//! Invariants: a namespace is 1 to [`MAX_NAMESPACE`] characters of
//! `[a-z0-9_-]` (never `:`), so the keys of two deployments sharing one Redis
//! never collide; the Redis URL, when given, is `redis://` or `rediss://`.

/// Longest deployment namespace.
pub const MAX_NAMESPACE: usize = 64;
/// The namespace when none is configured.
pub const DEFAULT_NAMESPACE: &str = "default";

/// `[state]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateSettings {
    /// Where the state lives.
    pub backend: StateBackend,
    /// The deployment's name in every shared key: `portcullis:<namespace>:…`.
    pub namespace: String,
}

impl Default for StateSettings {
    fn default() -> Self {
        Self {
            backend: StateBackend::Memory,
            namespace: DEFAULT_NAMESPACE.to_owned(),
        }
    }
}

/// State storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateBackend {
    /// In this process (one replica).
    Memory,
    /// Shared by every replica through the Redis at this URL.
    Redis(String),
}

impl StateBackend {
    /// The store's name, as refusals, logs and `/readyz` say it.
    pub fn name(&self) -> &'static str {
        match self {
            StateBackend::Memory => "memory",
            StateBackend::Redis(_) => "redis",
        }
    }
}

/// Whether `namespace` may name a deployment (see the module's invariants).
pub fn valid_namespace(namespace: &str) -> bool {
    (1..=MAX_NAMESPACE).contains(&namespace.len())
        && namespace
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}
