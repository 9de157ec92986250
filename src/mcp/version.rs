//! Protocol versions and the two eras they fall into.
//!
//! Legacy (2024-11-05 … 2025-11-25): `initialize` handshake, sessions, GET stream.
//! Modern (2026-07-28): stateless, version and capabilities in every request's
//! `_meta`, standard `Mcp-*` headers that must agree with the body.

/// The handshake-era versions the gateway serves.
pub(crate) const LEGACY: &[&str] = &["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];
/// The stateless-era versions the gateway serves.
pub(crate) const MODERN: &[&str] = &["2026-07-28"];
/// What a legacy request without `MCP-Protocol-Version` is assumed to speak.
pub(crate) const LEGACY_DEFAULT: &str = "2025-03-26";

/// Which set of transport rules a request follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Era {
    /// 2024-11-05 … 2025-11-25.
    Legacy,
    /// 2026-07-28 and later.
    Modern,
}

impl Era {
    /// Era of a known version string; `None` for versions the gateway does not know.
    pub(crate) fn of(version: &str) -> Option<Self> {
        if MODERN.contains(&version) {
            Some(Era::Modern)
        } else if LEGACY.contains(&version) {
            Some(Era::Legacy)
        } else {
            None
        }
    }

    /// Label for logs and audit.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Era::Legacy => "legacy",
            Era::Modern => "2026-07-28",
        }
    }
}

/// Every version the gateway accepts, oldest first.
pub(crate) fn supported() -> Vec<&'static str> {
    LEGACY.iter().chain(MODERN.iter()).copied().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eras() {
        assert_eq!(Era::of("2025-11-25"), Some(Era::Legacy));
        assert_eq!(Era::of("2024-11-05"), Some(Era::Legacy));
        assert_eq!(Era::of("2026-07-28"), Some(Era::Modern));
        assert_eq!(Era::of("2099-01-01"), None);
        assert_eq!(supported().len(), 5);
    }
}
