//! Verifying a bearer JWT: the compact JWS decoded, its signature checked
//! against the configured keys, then its claims and scopes.
//!
//! Place: inside authentication, for a bearer shaped like a JWT; what comes
//! out is the value of the client claim.
//!
//! Invariants: the signature is checked before any claim is read; the key
//! comes from the configured key set alone (`jku`, `x5u`, `jwk` and `x5c` in
//! a token are never used); `exp`, `iss` and `aud` are required, `nbf` and
//! `iat` checked when present, all with the configured leeway; the client
//! name is 1 to 256 bytes of visible ASCII.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Once, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::fetch::{FetchTimes, RemoteKeys};
use super::keys::{Algorithm, KeySet, Pick};
use super::settings::{JwtSettings, KeySource};

/// The longest bearer token verified; longer ones are refused unread.
const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// The longest client claim value accepted as a client name.
const MAX_CLIENT_NAME: usize = 256;

/// Verifies bearer JWTs under one `[auth.jwt]`.
#[derive(Debug)]
pub struct JwtVerifier {
    pub(super) settings: JwtSettings,
    remote: Option<Arc<RemoteKeys>>,
    file_keys: Arc<KeySet>,
}

/// Why a token was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refused {
    /// 401 `invalid_token`; the reason goes to the log only.
    Invalid(String),
    /// 403 `insufficient_scope`: a valid token without a required scope.
    Scope,
}

/// The parts of a compact JWS, decoded but not yet trusted.
#[derive(Debug)]
struct Token<'a> {
    signing_input: &'a str,
    header: Header,
    payload: Vec<u8>,
    signature: Vec<u8>,
}

#[derive(Debug, Deserialize)]
struct Header {
    alg: String,
    kid: Option<String>,
    /// Extensions the token says must be understood; none are, so any is refused.
    crit: Option<Value>,
}

/// Whether a bearer credential has the shape of a compact JWS (three
/// base64url segments); such a credential is verified as a JWT, never as an API key.
pub(crate) fn looks_like_jwt(credential: &str) -> bool {
    let segments: Vec<&str> = credential.splitn(4, '.').collect();
    segments.len() == 3
        && segments[..2].iter().all(|s| !s.is_empty())
        && segments.iter().all(|s| {
            s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

impl<'a> Token<'a> {
    fn parse(token: &'a str) -> Result<Self, Refused> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(invalid(format!(
                "the token is longer than {MAX_TOKEN_BYTES} bytes"
            )));
        }
        let (signing_input, signature) = token
            .rsplit_once('.')
            .ok_or_else(|| invalid("not a compact JWS"))?;
        let (header, payload) = signing_input
            .split_once('.')
            .ok_or_else(|| invalid("not a compact JWS"))?;
        let decode = |part: &str, what: &str| {
            URL_SAFE_NO_PAD
                .decode(part)
                .map_err(|_| invalid(format!("the {what} is not base64url")))
        };
        let header: Header = serde_json::from_slice(&decode(header, "header")?)
            .map_err(|e| invalid(format!("the header is not a JOSE header: {e}")))?;
        Ok(Self {
            signing_input,
            header,
            payload: decode(payload, "payload")?,
            signature: decode(signature, "signature")?,
        })
    }
}

impl JwtVerifier {
    /// Prepares verification under `settings`. A key set URL is not fetched
    /// here: the first request fetches it, and a task started then keeps it fresh.
    pub fn new(settings: JwtSettings) -> Self {
        let (remote, file_keys) = match &settings.keys {
            KeySource::File(set) => (
                None,
                Arc::new(KeySet {
                    keys: set.keys.clone(),
                }),
            ),
            KeySource::Url { url, refresh } => (
                Some(Arc::new(RemoteKeys {
                    url: url.clone(),
                    refresh: *refresh,
                    client: OnceLock::new(),
                    keys: ArcSwap::from_pointee(KeySet::default()),
                    loaded: AtomicBool::new(false),
                    fetches: tokio::sync::Mutex::new(FetchTimes::default()),
                    refresher: Once::new(),
                })),
                Arc::new(KeySet::default()),
            ),
        };
        Self {
            settings,
            remote,
            file_keys,
        }
    }

    /// The compiled settings.
    pub fn settings(&self) -> &JwtSettings {
        &self.settings
    }

    /// Verifies `token` for a request to `server`; on success, the value of
    /// the client claim and the token's verified claims.
    pub(crate) async fn verify(
        &self,
        token: &str,
        server: &str,
    ) -> Result<(String, Map<String, Value>), Refused> {
        let token = Token::parse(token)?;
        let alg = self.algorithm(&token.header)?;
        let kid = token.header.kid.as_deref();
        let (mut keys, fresh) = self.keys().await;
        if !fresh
            && keys.pick(kid, alg).err() == Some(Pick::Unknown)
            && let Some(remote) = &self.remote
            && remote.fetch_for_unknown_key().await
        {
            keys = remote.keys.load_full();
        }
        let key = keys.pick(kid, alg).map_err(|why| {
            invalid(match why {
                Pick::Unknown => format!("no key with kid {kid:?} fits {}", alg.name()),
                Pick::Unfit => format!("the key {kid:?} does not fit {}", alg.name()),
                Pick::Ambiguous => {
                    format!("the token names no kid and several keys fit {}", alg.name())
                }
            })
        })?;
        if !alg.verify(
            &key.material,
            token.signing_input.as_bytes(),
            &token.signature,
        ) {
            return Err(invalid("the signature does not verify"));
        }
        let claims: Map<String, Value> = serde_json::from_slice(&token.payload)
            .map_err(|_| invalid("the payload is not a JSON object"))?;
        let client = self.check_claims(&claims, now_secs(), server)?;
        self.check_scopes(&claims)?;
        Ok((client, claims))
    }

    /// The header's `alg`, when it is configured.
    fn algorithm(&self, header: &Header) -> Result<Algorithm, Refused> {
        if header.crit.is_some() {
            return Err(invalid("the header has critical extensions (crit)"));
        }
        Algorithm::parse(&header.alg)
            .ok()
            .filter(|a| self.settings.algorithms.contains(a))
            .ok_or_else(|| invalid(format!("the algorithm {:?} is not accepted", header.alg)))
    }

    /// The key set, and whether it was fetched for this very request.
    async fn keys(&self) -> (Arc<KeySet>, bool) {
        match &self.remote {
            Some(remote) => remote.current().await,
            None => (self.file_keys.clone(), false),
        }
    }

    /// `exp`, `nbf`, `iat`, `iss`, `aud` and the client claim, at `now`
    /// (seconds since the epoch); on success, the client claim's value.
    pub(crate) fn check_claims(
        &self,
        claims: &Map<String, Value>,
        now: f64,
        server: &str,
    ) -> Result<String, Refused> {
        let s = &self.settings;
        let leeway = s.leeway.as_secs_f64();
        let time = |name: &str| -> Result<Option<f64>, Refused> {
            match claims.get(name) {
                None => Ok(None),
                Some(v) => v
                    .as_f64()
                    .map(Some)
                    .ok_or_else(|| invalid(format!("\"{name}\" is not a number"))),
            }
        };
        let exp = time("exp")?.ok_or_else(|| invalid("the token has no \"exp\""))?;
        if now >= exp + leeway {
            return Err(invalid("the token has expired"));
        }
        if let Some(nbf) = time("nbf")?
            && nbf > now + leeway
        {
            return Err(invalid("the token is not valid yet (nbf)"));
        }
        if let Some(iat) = time("iat")?
            && iat > now + leeway
        {
            return Err(invalid("the token was issued in the future (iat)"));
        }
        match claims.get("iss").and_then(Value::as_str) {
            Some(iss) if iss == s.issuer => {}
            Some(iss) => return Err(invalid(format!("the issuer {iss:?} is not accepted"))),
            None => return Err(invalid("the token has no \"iss\"")),
        }
        let audiences: Vec<&str> = match claims.get("aud") {
            Some(Value::String(a)) => vec![a],
            Some(Value::Array(list)) => list.iter().filter_map(Value::as_str).collect(),
            _ => return Err(invalid("the token has no \"aud\"")),
        };
        let accepted = s.audiences.iter().any(|a| {
            a.server.as_deref().is_none_or(|only| only == server)
                && audiences.contains(&a.value.as_str())
        });
        if !accepted {
            return Err(invalid(format!(
                "the audience {audiences:?} is not accepted for the server {server:?}"
            )));
        }
        let client = claims
            .get(&s.client_claim)
            .and_then(Value::as_str)
            .filter(|c| !c.is_empty() && c.len() <= MAX_CLIENT_NAME && c.bytes().all(visible_ascii))
            .ok_or_else(|| {
                invalid(format!(
                    "the client claim {:?} is missing, not a string, empty, longer than {MAX_CLIENT_NAME} bytes or not visible ASCII",
                    s.client_claim
                ))
            })?;
        Ok(client.to_owned())
    }

    /// Every required scope, in `scope` (space-separated) or `scp` (a list or a string).
    pub(crate) fn check_scopes(&self, claims: &Map<String, Value>) -> Result<(), Refused> {
        let mut granted: Vec<&str> = Vec::new();
        for name in ["scope", "scp"] {
            match claims.get(name) {
                Some(Value::String(s)) => granted.extend(s.split(' ')),
                Some(Value::Array(list)) => granted.extend(list.iter().filter_map(Value::as_str)),
                _ => {}
            }
        }
        let all = self
            .settings
            .required_scopes
            .iter()
            .all(|r| granted.contains(&r.as_str()));
        if all { Ok(()) } else { Err(Refused::Scope) }
    }
}

/// A byte a client name may hold: printable ASCII, no space. A name is shown
/// in the audit trail, logs, metrics and the dashboard beside the configured
/// ones (ASCII letters, digits, `-_.`): an invisible, spacing or look-alike
/// character (ZWSP, a bidi override, Cyrillic `а`) would let a token pose
/// there as a keyed client.
fn visible_ascii(b: u8) -> bool {
    b.is_ascii_graphic()
}

fn invalid(why: impl Into<String>) -> Refused {
    Refused::Invalid(why.into())
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}
