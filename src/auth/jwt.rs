//! Bearer JWTs issued by an OAuth authorization server (`[auth.jwt]`), and the
//! RFC 9728 protected-resource metadata that tells clients where to get one.
//!
//! Place in the path: inside authentication. A bearer shaped like a JWT is
//! verified here; what comes out is the value of the client claim, which
//! [`super::ClientTable`] turns into a client name.
//!
//! Invariants: only public-key algorithms, and only the configured ones; the
//! key comes from the configured key set alone (`jku`, `x5u`, `jwk` and `x5c`
//! in a token are never used) and must fit the token's `alg` by key type,
//! curve and the key's own `alg`; the signature is checked before any claim is
//! read; `exp`, `iss` and `aud` are required, `nbf` and `iat` are checked when
//! present, all with the configured leeway. A key set URL is fetched without
//! redirects or proxies, with a timeout and a size cap; an unknown `kid`
//! triggers at most one extra fetch per [`fetch::UNKNOWN_KID_COOLDOWN`].

mod fetch;
mod keys;
mod metadata;
mod settings;
mod verify;

#[cfg(test)]
mod tests;

pub use keys::{Algorithm, KeySet};
pub(crate) use metadata::METADATA_PATH;
pub use settings::{Audience, JwtSettings, KeySource};
pub use verify::JwtVerifier;
pub(crate) use verify::{Refused, looks_like_jwt};
