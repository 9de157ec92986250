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
//! triggers at most one extra fetch per [`UNKNOWN_KID_COOLDOWN`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Once, OnceLock, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde::Deserialize;
use serde_json::{Map, Value, json};

/// The longest bearer token verified; longer ones are refused unread.
const MAX_TOKEN_BYTES: usize = 16 * 1024;
/// The largest key set document read from `jwks_url`.
const MAX_JWKS_BYTES: usize = 1024 * 1024;
/// The most keys a key set may hold.
const MAX_KEYS: usize = 100;
/// Longest wait for the key set URL, connection included.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// At most one fetch per this long is caused by tokens naming an unknown `kid`.
pub(crate) const UNKNOWN_KID_COOLDOWN: Duration = Duration::from_secs(30);
/// While no key set has been fetched yet, requests retry the fetch at most this often.
const RETRY_FAILED_FETCH: Duration = Duration::from_secs(5);
/// The longest client claim value accepted as a client name.
const MAX_CLIENT_NAME: usize = 256;
/// Where RFC 9728 puts the metadata of a resource, before the resource's path.
pub(crate) const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

/// A signature algorithm a token may use. Symmetric (`HS*`) and `none` do not exist here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    Rs256,
    Rs384,
    Rs512,
    Ps256,
    Ps384,
    Ps512,
    Es256,
    Es384,
    EdDsa,
}

/// `[auth.jwt]`, compiled.
#[derive(Debug)]
pub struct JwtSettings {
    /// `iss` must be exactly this.
    pub issuer: String,
    /// `aud` must contain one of these (that applies to the server called).
    pub audiences: Vec<Audience>,
    /// Where the verification keys come from.
    pub keys: KeySource,
    /// The claim whose value names the client (default `sub`).
    pub client_claim: String,
    /// Clock skew allowed on `exp`, `nbf` and `iat` (default 60 s).
    pub leeway: Duration,
    /// Algorithms a token may use (default RS256, ES256, EdDSA).
    pub algorithms: Vec<Algorithm>,
    /// Scopes every token must carry (in `scope` or `scp`).
    pub required_scopes: Vec<String>,
    /// The origin clients reach the gateway at, e.g. `https://mcp.example.com`.
    pub resource_url: String,
}

/// One accepted audience.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Audience {
    /// As configured.
    pub value: String,
    /// Set when the audience is one server's URL (`…/mcp/<server>`, a
    /// configured server): it admits tokens at that server only. `None` is the
    /// whole gateway (`…/mcp` or the origin alone); the configuration refuses
    /// every other audience, so a token is never admitted wider than written.
    pub server: Option<String>,
}

/// Where verification keys come from.
#[derive(Debug)]
pub enum KeySource {
    /// `jwks_file`: read at load and on reload.
    File(KeySet),
    /// `jwks_url`: fetched, cached, refreshed every `refresh`.
    Url {
        url: reqwest::Url,
        refresh: Duration,
    },
}

/// Verification keys, parsed from a JWKS document.
#[derive(Debug, Default)]
pub struct KeySet {
    keys: Vec<Key>,
}

#[derive(Debug, Clone)]
struct Key {
    kid: Option<String>,
    alg: Option<Algorithm>,
    material: Material,
}

#[derive(Clone)]
enum Material {
    Rsa { n: Vec<u8>, e: Vec<u8> },
    P256(Vec<u8>),
    P384(Vec<u8>),
    Ed25519(Vec<u8>),
}

/// Verifies bearer JWTs under one `[auth.jwt]`.
#[derive(Debug)]
pub struct JwtVerifier {
    settings: JwtSettings,
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

/// A key set fetched from `jwks_url`, refreshed in the background.
#[derive(Debug)]
struct RemoteKeys {
    url: reqwest::Url,
    refresh: Duration,
    client: OnceLock<reqwest::Client>,
    keys: ArcSwap<KeySet>,
    loaded: AtomicBool,
    fetches: tokio::sync::Mutex<FetchTimes>,
    refresher: Once,
}

#[derive(Debug, Default)]
struct FetchTimes {
    attempted: Option<Instant>,
    forced: Option<Instant>,
}

// === impl Algorithm ===

impl Algorithm {
    /// The default `algorithms`.
    pub const DEFAULT: &'static [Algorithm] =
        &[Algorithm::Rs256, Algorithm::Es256, Algorithm::EdDsa];
    const ALL: &'static [Algorithm] = &[
        Algorithm::Rs256,
        Algorithm::Rs384,
        Algorithm::Rs512,
        Algorithm::Ps256,
        Algorithm::Ps384,
        Algorithm::Ps512,
        Algorithm::Es256,
        Algorithm::Es384,
        Algorithm::EdDsa,
    ];

    /// Reads a JOSE `alg` name; `Err` says why it is not accepted.
    pub fn parse(name: &str) -> Result<Self, String> {
        if let Some(alg) = Self::ALL.iter().find(|a| a.name() == name) {
            return Ok(*alg);
        }
        if name.eq_ignore_ascii_case("none") {
            return Err("unsigned tokens (alg \"none\") are never accepted".into());
        }
        if name.to_ascii_uppercase().starts_with("HS") {
            return Err(format!(
                "{name:?} is a shared-secret algorithm; only public-key algorithms are accepted, so a published key can never serve as an HMAC secret"
            ));
        }
        Err(format!(
            "unknown algorithm {name:?}; expected one of {}",
            Self::ALL
                .iter()
                .map(|a| a.name())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }

    /// The JOSE name.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Rs256 => "RS256",
            Algorithm::Rs384 => "RS384",
            Algorithm::Rs512 => "RS512",
            Algorithm::Ps256 => "PS256",
            Algorithm::Ps384 => "PS384",
            Algorithm::Ps512 => "PS512",
            Algorithm::Es256 => "ES256",
            Algorithm::Es384 => "ES384",
            Algorithm::EdDsa => "EdDSA",
        }
    }

    /// Whether `material` is the kind of key this algorithm verifies with.
    fn fits(self, material: &Material) -> bool {
        match material {
            Material::Rsa { .. } => matches!(
                self,
                Algorithm::Rs256
                    | Algorithm::Rs384
                    | Algorithm::Rs512
                    | Algorithm::Ps256
                    | Algorithm::Ps384
                    | Algorithm::Ps512
            ),
            Material::P256(_) => self == Algorithm::Es256,
            Material::P384(_) => self == Algorithm::Es384,
            Material::Ed25519(_) => self == Algorithm::EdDsa,
        }
    }

    fn verify(self, material: &Material, message: &[u8], sig: &[u8]) -> bool {
        let rsa = match self {
            Algorithm::Rs256 => Some(&signature::RSA_PKCS1_2048_8192_SHA256),
            Algorithm::Rs384 => Some(&signature::RSA_PKCS1_2048_8192_SHA384),
            Algorithm::Rs512 => Some(&signature::RSA_PKCS1_2048_8192_SHA512),
            Algorithm::Ps256 => Some(&signature::RSA_PSS_2048_8192_SHA256),
            Algorithm::Ps384 => Some(&signature::RSA_PSS_2048_8192_SHA384),
            Algorithm::Ps512 => Some(&signature::RSA_PSS_2048_8192_SHA512),
            _ => None,
        };
        match (material, rsa) {
            (Material::Rsa { n, e }, Some(params)) => RsaPublicKeyComponents { n, e }
                .verify(params, message, sig)
                .is_ok(),
            (Material::P256(point), None) if self == Algorithm::Es256 => {
                UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                    .verify(message, sig)
                    .is_ok()
            }
            (Material::P384(point), None) if self == Algorithm::Es384 => {
                UnparsedPublicKey::new(&signature::ECDSA_P384_SHA384_FIXED, point)
                    .verify(message, sig)
                    .is_ok()
            }
            (Material::Ed25519(x), None) if self == Algorithm::EdDsa => {
                UnparsedPublicKey::new(&signature::ED25519, x)
                    .verify(message, sig)
                    .is_ok()
            }
            _ => false,
        }
    }
}

// === impl KeySet ===

impl KeySet {
    /// Parses a JWKS document (`{"keys": [...]}`). Keys that cannot verify
    /// signatures here (encryption keys, symmetric keys, unknown types) are
    /// left out; their reasons come back beside the set.
    pub fn parse(document: &[u8]) -> Result<(KeySet, Vec<String>), String> {
        let value: Value = serde_json::from_slice(document)
            .map_err(|e| format!("the key set is not JSON: {e}"))?;
        let keys = value
            .get("keys")
            .and_then(Value::as_array)
            .ok_or("the key set has no \"keys\" array (expected a JWKS document)")?;
        if keys.len() > MAX_KEYS {
            return Err(format!(
                "the key set has {} keys; at most {MAX_KEYS} are read",
                keys.len()
            ));
        }
        let mut set = KeySet::default();
        let mut skipped = Vec::new();
        for (i, jwk) in keys.iter().enumerate() {
            match Key::from_jwk(jwk) {
                Ok(key) => set.keys.push(key),
                Err(why) => {
                    let kid = jwk.get("kid").and_then(Value::as_str).unwrap_or("");
                    skipped.push(format!("key {i} (kid {kid:?}): {why}"));
                }
            }
        }
        Ok((set, skipped))
    }

    /// How many usable keys the set holds.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// True when no key is usable.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The key a token with `kid` and `alg` must be verified with.
    fn pick(&self, kid: Option<&str>, alg: Algorithm) -> Result<&Key, Pick> {
        match kid {
            Some(kid) => {
                let mut named = self.keys.iter().filter(|k| k.kid.as_deref() == Some(kid));
                let first = named.next().ok_or(Pick::Unknown)?;
                std::iter::once(first)
                    .chain(named)
                    .find(|k| k.fits(alg))
                    .ok_or(Pick::Unfit)
            }
            None => {
                let mut fitting = self.keys.iter().filter(|k| k.fits(alg));
                match (fitting.next(), fitting.next()) {
                    (Some(key), None) => Ok(key),
                    (None, _) => Err(Pick::Unknown),
                    (Some(_), Some(_)) => Err(Pick::Ambiguous),
                }
            }
        }
    }
}

/// Why no key was picked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pick {
    Unknown,
    Unfit,
    Ambiguous,
}

// === impl Key ===

impl Key {
    fn from_jwk(jwk: &Value) -> Result<Key, String> {
        let field = |name: &str| jwk.get(name).and_then(Value::as_str);
        let bytes = |name: &str| -> Result<Vec<u8>, String> {
            let text = field(name).ok_or_else(|| format!("no \"{name}\""))?;
            URL_SAFE_NO_PAD
                .decode(text)
                .map_err(|_| format!("\"{name}\" is not base64url"))
        };
        if jwk.get("d").is_some() {
            return Err("it carries private key material (\"d\"); publish public keys only".into());
        }
        if let Some(usage) = jwk.get("use")
            && usage.as_str() != Some("sig")
        {
            return Err(format!("its \"use\" is {usage}, not \"sig\""));
        }
        if let Some(ops) = jwk.get("key_ops") {
            let verify = ops
                .as_array()
                .is_some_and(|ops| ops.iter().any(|o| o.as_str() == Some("verify")));
            if !verify {
                return Err("its \"key_ops\" do not include \"verify\"".into());
            }
        }
        let alg = match jwk.get("alg") {
            None => None,
            Some(a) => Some(Algorithm::parse(
                a.as_str().ok_or("\"alg\" is not a string")?,
            )?),
        };
        let kid = match jwk.get("kid") {
            None => None,
            Some(k) => Some(k.as_str().ok_or("\"kid\" is not a string")?.to_owned()),
        };
        let material = match field("kty") {
            Some("RSA") => {
                let n = strip_zeros(bytes("n")?);
                let e = strip_zeros(bytes("e")?);
                if n.len() < 256 {
                    return Err(format!(
                        "the RSA modulus has {} bits; at least 2048 are required",
                        n.len() * 8
                    ));
                }
                Material::Rsa { n, e }
            }
            Some("EC") => {
                let (len, make): (usize, fn(Vec<u8>) -> Material) = match field("crv") {
                    Some("P-256") => (32, Material::P256),
                    Some("P-384") => (48, Material::P384),
                    other => return Err(format!("the EC curve {other:?} is not supported")),
                };
                let (x, y) = (bytes("x")?, bytes("y")?);
                if x.len() != len || y.len() != len {
                    return Err("the EC coordinates have the wrong length".into());
                }
                // Uncompressed SEC1 point: 0x04 ‖ x ‖ y.
                let mut point = Vec::with_capacity(1 + 2 * len);
                point.push(4);
                point.extend_from_slice(&x);
                point.extend_from_slice(&y);
                make(point)
            }
            Some("OKP") => match field("crv") {
                Some("Ed25519") => {
                    let x = bytes("x")?;
                    if x.len() != 32 {
                        return Err("the Ed25519 key is not 32 bytes".into());
                    }
                    Material::Ed25519(x)
                }
                other => return Err(format!("the OKP curve {other:?} is not supported")),
            },
            Some("oct") => return Err("symmetric keys are never used".into()),
            other => return Err(format!("the key type {other:?} is not supported")),
        };
        let key = Key { kid, alg, material };
        if let Some(alg) = key.alg
            && !alg.fits(&key.material)
        {
            return Err(format!(
                "its \"alg\" {} does not fit its key type",
                alg.name()
            ));
        }
        Ok(key)
    }

    /// The key may verify `alg`: right type and curve, and its own `alg` (if any) agrees.
    fn fits(&self, alg: Algorithm) -> bool {
        alg.fits(&self.material) && self.alg.is_none_or(|own| own == alg)
    }
}

fn strip_zeros(mut bytes: Vec<u8>) -> Vec<u8> {
    let zeros = bytes.iter().take_while(|b| **b == 0).count();
    bytes.drain(..zeros);
    bytes
}

impl std::fmt::Debug for Material {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Material::Rsa { n, .. } => write!(f, "RSA({} bits)", n.len() * 8),
            Material::P256(_) => f.write_str("P-256"),
            Material::P384(_) => f.write_str("P-384"),
            Material::Ed25519(_) => f.write_str("Ed25519"),
        }
    }
}

// === impl Token ===

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

// === impl JwtVerifier ===

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
    /// the client claim.
    pub(crate) async fn verify(&self, token: &str, server: &str) -> Result<String, Refused> {
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
        Ok(client)
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
            .filter(|c| {
                !c.is_empty() && c.len() <= MAX_CLIENT_NAME && !c.chars().any(char::is_control)
            })
            .ok_or_else(|| {
                invalid(format!(
                    "the client claim {:?} is missing, not a string, empty, longer than {MAX_CLIENT_NAME} bytes or has control characters",
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

    /// `[auth.jwt]` as `portcullis check` prints it.
    pub fn describe(&self) -> String {
        let s = &self.settings;
        let keys = match &s.keys {
            KeySource::File(set) => format!("{} key(s) from the file read at load", set.len()),
            KeySource::Url { url, refresh } => format!(
                "from {url}, fetched on first use and every {}",
                crate::util::time::humanize(*refresh)
            ),
        };
        let audiences: Vec<String> = s
            .audiences
            .iter()
            .map(|a| match &a.server {
                Some(server) => format!("{} (server {server} only)", a.value),
                None => a.value.clone(),
            })
            .collect();
        let algorithms: Vec<&str> = s.algorithms.iter().map(|a| a.name()).collect();
        let mut out = format!(
            "\nbearer JWTs (a token names its client in \"{}\"; unnamed clients match \"*\" rules)\n  issuer     {}\n  audience   {}\n  keys       {keys}\n  algorithms {}\n",
            s.client_claim,
            s.issuer,
            audiences.join(", "),
            algorithms.join(", "),
        );
        if !s.required_scopes.is_empty() {
            out.push_str(&format!("  scopes     {}\n", s.required_scopes.join(" ")));
        }
        out.push_str(&format!(
            "  metadata   {}/mcp/<server>\n",
            self.metadata_url("")
        ));
        out
    }

    /// RFC 9728 metadata of the resource at `resource_path` (`""`, `/mcp` or `/mcp/<server>`).
    pub(crate) fn metadata(&self, resource_path: &str) -> Value {
        let s = &self.settings;
        let mut doc = json!({
            "resource": format!("{}{resource_path}", s.resource_url),
            "authorization_servers": [s.issuer],
            "bearer_methods_supported": ["header"],
        });
        if !s.required_scopes.is_empty() {
            doc["scopes_supported"] = json!(s.required_scopes);
        }
        doc
    }

    /// The absolute URL of that metadata, for `WWW-Authenticate`.
    pub(crate) fn metadata_url(&self, resource_path: &str) -> String {
        format!(
            "{}{METADATA_PATH}{resource_path}",
            self.settings.resource_url
        )
    }
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

// === impl RemoteKeys ===

impl RemoteKeys {
    /// The key set in force: starts the refresher on first use, and fetches
    /// inline while nothing has been fetched yet (at most every few seconds).
    /// True beside it when this call fetched.
    async fn current(self: &Arc<Self>) -> (Arc<KeySet>, bool) {
        self.refresher.call_once(|| {
            tokio::spawn(refresh(Arc::downgrade(self), self.refresh));
        });
        let mut fetched = false;
        if !self.loaded.load(Ordering::Acquire) {
            let mut times = self.fetches.lock().await;
            let due = times
                .attempted
                .is_none_or(|t| t.elapsed() >= RETRY_FAILED_FETCH);
            if !self.loaded.load(Ordering::Acquire) && due {
                times.attempted = Some(Instant::now());
                self.fetch().await;
                fetched = true;
            }
        }
        (self.keys.load_full(), fetched)
    }

    /// A token named a key the set lacks: fetch again, unless that was done
    /// less than [`UNKNOWN_KID_COOLDOWN`] ago. True when a fetch was made.
    async fn fetch_for_unknown_key(&self) -> bool {
        let mut times = self.fetches.lock().await;
        if times
            .forced
            .is_some_and(|t| t.elapsed() < UNKNOWN_KID_COOLDOWN)
        {
            return false;
        }
        let now = Instant::now();
        times.forced = Some(now);
        times.attempted = Some(now);
        self.fetch().await;
        true
    }

    /// Fetches the key set and swaps it in; on any failure the previous set stays.
    async fn fetch(&self) {
        match self.download().await {
            Ok((set, skipped)) => {
                for why in &skipped {
                    tracing::warn!(url = %self.url, "key set: left out {why}");
                }
                if set.is_empty() {
                    tracing::warn!(url = %self.url, "the key set holds no usable key; keeping the previous one");
                    return;
                }
                tracing::debug!(url = %self.url, keys = set.len(), "key set fetched");
                self.keys.store(Arc::new(set));
                self.loaded.store(true, Ordering::Release);
            }
            Err(why) => {
                tracing::warn!(url = %self.url, "cannot fetch the key set: {why}; keeping the previous one");
            }
        }
    }

    async fn download(&self) -> Result<(KeySet, Vec<String>), String> {
        let client = match self.client.get() {
            Some(c) => c.clone(),
            None => {
                // Built on first use: by then the process has its TLS provider.
                let c = reqwest::Client::builder()
                    .redirect(reqwest::redirect::Policy::none())
                    .no_proxy()
                    .timeout(FETCH_TIMEOUT)
                    .connect_timeout(FETCH_TIMEOUT)
                    .build()
                    .map_err(|e| e.to_string())?;
                self.client.get_or_init(|| c).clone()
            }
        };
        let mut response = client
            .get(self.url.clone())
            .header(http::header::ACCEPT, "application/json")
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if response.status() != http::StatusCode::OK {
            return Err(format!(
                "HTTP {} (redirects are not followed)",
                response.status()
            ));
        }
        if response
            .content_length()
            .is_some_and(|n| n > MAX_JWKS_BYTES as u64)
        {
            return Err(format!("the key set is larger than {MAX_JWKS_BYTES} bytes"));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| e.to_string())? {
            if body.len() + chunk.len() > MAX_JWKS_BYTES {
                return Err(format!("the key set is larger than {MAX_JWKS_BYTES} bytes"));
            }
            body.extend_from_slice(&chunk);
        }
        KeySet::parse(&body)
    }
}

/// Refreshes the key set every `every` for as long as its configuration lives.
async fn refresh(keys: Weak<RemoteKeys>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(keys) = keys.upgrade() else {
            return;
        };
        let mut times = keys.fetches.lock().await;
        times.attempted = Some(Instant::now());
        keys.fetch().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verifier() -> JwtVerifier {
        JwtVerifier::new(JwtSettings {
            issuer: "https://idp.example.com".into(),
            audiences: vec![
                Audience {
                    value: "https://gw.example.com/mcp".into(),
                    server: None,
                },
                Audience {
                    value: "https://gw.example.com/mcp/flights".into(),
                    server: Some("flights".into()),
                },
            ],
            keys: KeySource::File(KeySet::default()),
            client_claim: "sub".into(),
            leeway: Duration::from_secs(60),
            algorithms: Algorithm::DEFAULT.to_vec(),
            required_scopes: vec!["mcp:tools".into()],
            resource_url: "https://gw.example.com".into(),
        })
    }

    const NOW: f64 = 1_800_000_000.0;

    fn claims(extra: Value) -> Map<String, Value> {
        let mut base = json!({
            "iss": "https://idp.example.com",
            "aud": "https://gw.example.com/mcp",
            "sub": "carol",
            "exp": NOW + 300.0,
        });
        for (k, v) in extra.as_object().expect("object") {
            if v.is_null() {
                base.as_object_mut().expect("object").remove(k);
            } else {
                base[k] = v.clone();
            }
        }
        base.as_object().expect("object").clone()
    }

    fn check(extra: Value, server: &str) -> Result<String, Refused> {
        verifier().check_claims(&claims(extra), NOW, server)
    }

    #[test]
    fn a_token_within_its_lifetime_names_its_client() {
        assert_eq!(check(json!({}), "weather"), Ok("carol".into()));
        assert_eq!(
            check(json!({"nbf": NOW - 10.0, "iat": NOW - 10.0}), "weather"),
            Ok("carol".into())
        );
    }

    #[test]
    fn times_are_checked_with_the_leeway() {
        // Expired 30 s ago: inside the 60 s leeway.
        assert!(check(json!({"exp": NOW - 30.0}), "x").is_ok());
        assert!(check(json!({"exp": NOW - 60.0}), "x").is_err());
        assert!(check(json!({"exp": null}), "x").is_err());
        assert!(check(json!({"exp": "soon"}), "x").is_err());
        assert!(check(json!({"nbf": NOW + 30.0}), "x").is_ok());
        assert!(check(json!({"nbf": NOW + 61.0}), "x").is_err());
        assert!(check(json!({"iat": NOW + 61.0}), "x").is_err());
        assert!(check(json!({"nbf": "later"}), "x").is_err());
    }

    #[test]
    fn issuer_is_exact() {
        assert!(check(json!({"iss": "https://idp.example.com/"}), "x").is_err());
        assert!(check(json!({"iss": "https://evil.example.com"}), "x").is_err());
        assert!(check(json!({"iss": null}), "x").is_err());
    }

    #[test]
    fn audience_must_be_configured_and_a_server_audience_binds_to_its_server() {
        assert!(check(json!({"aud": ["other", "https://gw.example.com/mcp"]}), "x").is_ok());
        assert!(check(json!({"aud": "https://other.example.com"}), "x").is_err());
        assert!(check(json!({"aud": null}), "x").is_err());
        assert!(check(json!({"aud": 7}), "x").is_err());
        let flights = json!({"aud": "https://gw.example.com/mcp/flights"});
        assert!(check(flights.clone(), "flights").is_ok());
        assert!(check(flights, "weather").is_err());
    }

    #[test]
    fn the_client_claim_must_be_a_plain_string() {
        assert!(check(json!({"sub": null}), "x").is_err());
        assert!(check(json!({"sub": 42}), "x").is_err());
        assert!(check(json!({"sub": ""}), "x").is_err());
        assert!(check(json!({"sub": "a\nb"}), "x").is_err());
        assert!(check(json!({"sub": "x".repeat(257)}), "x").is_err());
        assert_eq!(
            check(json!({"sub": "auth0|abc123"}), "x"),
            Ok("auth0|abc123".into())
        );
    }

    #[test]
    fn required_scopes_come_from_scope_or_scp() {
        let v = verifier();
        let with = |extra| v.check_scopes(&claims(extra));
        assert_eq!(with(json!({})), Err(Refused::Scope));
        assert_eq!(with(json!({"scope": "openid mcp:tools"})), Ok(()));
        assert_eq!(with(json!({"scp": ["mcp:tools"]})), Ok(()));
        assert_eq!(with(json!({"scope": "mcp:tool"})), Err(Refused::Scope));
        assert_eq!(with(json!({"scope": "mcp:toolsx"})), Err(Refused::Scope));
    }

    #[test]
    fn symmetric_and_unsigned_algorithms_do_not_exist() {
        assert!(Algorithm::parse("HS256").is_err());
        assert!(Algorithm::parse("hs512").is_err());
        assert!(Algorithm::parse("none").is_err());
        assert!(Algorithm::parse("NONE").is_err());
        assert!(Algorithm::parse("ES512").is_err());
        assert_eq!(Algorithm::parse("EdDSA"), Ok(Algorithm::EdDsa));
    }

    #[test]
    fn keys_fit_only_their_algorithms() {
        let ed = json!({"kty": "OKP", "crv": "Ed25519", "x": URL_SAFE_NO_PAD.encode([7u8; 32]), "kid": "e"});
        let (set, skipped) = KeySet::parse(json!({"keys": [
            ed,
            {"kty": "oct", "k": "c2VjcmV0", "kid": "s"},
            {"kty": "OKP", "crv": "Ed25519", "x": URL_SAFE_NO_PAD.encode([7u8; 32]), "use": "enc"},
            {"kty": "OKP", "crv": "Ed25519", "x": URL_SAFE_NO_PAD.encode([7u8; 32]), "d": "eA"},
            {"kty": "OKP", "crv": "Ed25519", "x": URL_SAFE_NO_PAD.encode([7u8; 32]), "alg": "ES256"},
        ]}).to_string().as_bytes())
        .expect("a key set");
        assert_eq!(set.len(), 1);
        assert_eq!(skipped.len(), 4, "{skipped:?}");
        assert!(set.pick(Some("e"), Algorithm::EdDsa).is_ok());
        assert_eq!(
            set.pick(Some("e"), Algorithm::Rs256).err(),
            Some(Pick::Unfit)
        );
        assert_eq!(
            set.pick(Some("s"), Algorithm::EdDsa).err(),
            Some(Pick::Unknown)
        );
        assert!(set.pick(None, Algorithm::EdDsa).is_ok());
        assert_eq!(set.pick(None, Algorithm::Es256).err(), Some(Pick::Unknown));
        assert!(KeySet::parse(b"{}").is_err());
        assert!(KeySet::parse(b"not json").is_err());
    }

    #[test]
    fn only_three_base64url_segments_look_like_a_jwt() {
        assert!(looks_like_jwt("eyJh.eyJz.c2ln"));
        assert!(looks_like_jwt("eyJh.eyJz."));
        assert!(!looks_like_jwt("alice-key"));
        assert!(!looks_like_jwt("a.b"));
        assert!(!looks_like_jwt("a.b.c.d"));
        assert!(!looks_like_jwt(".b.c"));
        assert!(!looks_like_jwt("a+.b.c"));
    }

    #[test]
    fn metadata_names_the_resource_and_the_issuer() {
        let v = verifier();
        assert_eq!(
            v.metadata("/mcp/flights"),
            json!({
                "resource": "https://gw.example.com/mcp/flights",
                "authorization_servers": ["https://idp.example.com"],
                "bearer_methods_supported": ["header"],
                "scopes_supported": ["mcp:tools"],
            })
        );
        assert_eq!(
            v.metadata_url("/mcp"),
            "https://gw.example.com/.well-known/oauth-protected-resource/mcp"
        );
    }
}
