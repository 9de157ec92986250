//! Verification keys: the algorithms a token may use, a JWKS document
//! parsed into a [`KeySet`], and the check that a key fits an algorithm.
//!
//! Place: beneath verification; a key set comes from `jwks_file` at load or
//! from `jwks_url` when fetched.
//!
//! Invariants: only public-key algorithms exist here (no `HS*`, no `none`);
//! a key fits a token's `alg` by key type, curve and the key's own `alg`; a
//! key set holds at most [`MAX_KEYS`] keys, and a key it cannot use is
//! skipped with a warning, never guessed at.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde_json::Value;

/// The most keys a key set may hold.
const MAX_KEYS: usize = 100;

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

/// Verification keys, parsed from a JWKS document.
#[derive(Debug, Default)]
pub struct KeySet {
    pub(super) keys: Vec<Key>,
}

#[derive(Debug, Clone)]
pub(super) struct Key {
    kid: Option<String>,
    alg: Option<Algorithm>,
    pub(super) material: Material,
}

#[derive(Clone)]
pub(super) enum Material {
    Rsa { n: Vec<u8>, e: Vec<u8> },
    P256(Vec<u8>),
    P384(Vec<u8>),
    Ed25519(Vec<u8>),
}

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

    pub(super) fn verify(self, material: &Material, message: &[u8], sig: &[u8]) -> bool {
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
    pub(super) fn pick(&self, kid: Option<&str>, alg: Algorithm) -> Result<&Key, Pick> {
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
pub(super) enum Pick {
    Unknown,
    Unfit,
    Ambiguous,
}

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
