//! The gateway's own signing keys: identity assertions for upstreams, client
//! assertions for `private_key_jwt`, and the JWKS that publishes the keys.
//!
//! Place: keys are read at load (`[identity] signing_keys`, from a file or
//! the environment, PKCS#8 PEM) into [`SigningKey`]s; the broker signs with
//! the first, the MCP listener publishes all of them at [`JWKS_PATH`].
//!
//! Invariants: signing uses `ring`, as verification does (no second crypto
//! stack); only public-key algorithms (EdDSA, ES256, RS256), never a shared
//! secret, so a published key can never mint a token; each key's `kid` is its
//! RFC 7638 thumbprint, so the same key has the same `kid` on every replica
//! and after a restart; a private key is never printed (`Debug` shows the `kid`).

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ring::rand::SystemRandom;
use ring::signature::{
    self, EcdsaKeyPair, Ed25519KeyPair, KeyPair as _, RsaKeyPair, RsaPublicKeyComponents,
};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

/// Where the MCP listener publishes the gateway's public keys.
pub const JWKS_PATH: &str = "/.well-known/jwks.json";

/// One of the gateway's signing keys.
pub struct SigningKey {
    pair: Pair,
    kid: String,
    jwk: Value,
}

enum Pair {
    Ed25519(Ed25519KeyPair),
    P256(EcdsaKeyPair),
    Rsa(RsaKeyPair),
}

impl SigningKey {
    /// Reads a PKCS#8 PEM private key (`openssl genpkey -algorithm ed25519`,
    /// `-algorithm EC -pkeyopt ec_paramgen_curve:P-256`, or `-algorithm RSA`);
    /// `Err` says what was wrong, never what the key holds.
    pub fn from_pem(pem: &str) -> Result<Self, String> {
        let der = pem_body(pem, "PRIVATE KEY").ok_or(
            "expected a PKCS#8 PEM private key (-----BEGIN PRIVATE KEY-----); convert others with \
             `openssl pkcs8 -topk8 -nocrypt -in KEY`",
        )?;
        let rng = SystemRandom::new();
        let pair = if let Ok(k) = Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der) {
            Pair::Ed25519(k)
        } else if let Ok(k) =
            EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &der, &rng)
        {
            Pair::P256(k)
        } else if let Ok(k) = RsaKeyPair::from_pkcs8(&der) {
            if k.public().modulus_len() < 256 {
                return Err("an RSA key must have at least 2048 bits".into());
            }
            Pair::Rsa(k)
        } else {
            return Err(
                "the key is not an Ed25519, P-256 or RSA private key that can sign (other curves are not supported)"
                    .into(),
            );
        };
        let jwk = public_jwk(&pair);
        let kid = thumbprint(&jwk);
        let mut jwk = jwk;
        if let Value::Object(m) = &mut jwk {
            m.insert("kid".into(), kid.clone().into());
            m.insert("use".into(), "sig".into());
            m.insert("alg".into(), pair.alg().into());
        }
        Ok(Self { pair, kid, jwk })
    }

    /// The key's id: its RFC 7638 thumbprint.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The JOSE algorithm it signs with.
    pub fn alg(&self) -> &'static str {
        self.pair.alg()
    }

    /// The public half, as a JWK with `kid`, `use` and `alg`.
    pub fn public_jwk(&self) -> &Value {
        &self.jwk
    }

    /// A compact JWS of `claims`, with `typ` in the header.
    pub fn sign(&self, typ: &str, claims: &Map<String, Value>) -> Result<String, String> {
        let header = json!({"alg": self.alg(), "kid": self.kid, "typ": typ});
        let input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(Value::Object(claims.clone()).to_string())
        );
        let rng = SystemRandom::new();
        let signature = match &self.pair {
            Pair::Ed25519(k) => k.sign(input.as_bytes()).as_ref().to_vec(),
            Pair::P256(k) => k
                .sign(&rng, input.as_bytes())
                .map_err(|_| "the P-256 signature failed")?
                .as_ref()
                .to_vec(),
            Pair::Rsa(k) => {
                let mut out = vec![0; k.public().modulus_len()];
                k.sign(
                    &signature::RSA_PKCS1_SHA256,
                    &rng,
                    input.as_bytes(),
                    &mut out,
                )
                .map_err(|_| "the RSA signature failed")?;
                out
            }
        };
        Ok(format!("{input}.{}", URL_SAFE_NO_PAD.encode(signature)))
    }
}

impl PartialEq for SigningKey {
    fn eq(&self, other: &Self) -> bool {
        self.kid == other.kid
    }
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SigningKey({} {})", self.alg(), self.kid)
    }
}

impl Pair {
    fn alg(&self) -> &'static str {
        match self {
            Pair::Ed25519(_) => "EdDSA",
            Pair::P256(_) => "ES256",
            Pair::Rsa(_) => "RS256",
        }
    }
}

/// The JWKS document publishing `keys` (the signing one first).
pub fn jwks<'k>(keys: impl IntoIterator<Item = &'k SigningKey>) -> Value {
    let keys: Vec<Value> = keys.into_iter().map(|k| k.public_jwk().clone()).collect();
    json!({ "keys": keys })
}

/// A new random `jti` (128 bits).
pub fn new_jti() -> String {
    URL_SAFE_NO_PAD.encode(rand::random::<[u8; 16]>())
}

/// Seconds since the epoch, now.
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn public_jwk(pair: &Pair) -> Value {
    match pair {
        Pair::Ed25519(k) => json!({
            "kty": "OKP",
            "crv": "Ed25519",
            "x": URL_SAFE_NO_PAD.encode(k.public_key().as_ref()),
        }),
        Pair::P256(k) => {
            // Uncompressed point: 0x04 || x || y.
            let point = k.public_key().as_ref();
            let (x, y) = point[1..].split_at(32);
            json!({
                "kty": "EC",
                "crv": "P-256",
                "x": URL_SAFE_NO_PAD.encode(x),
                "y": URL_SAFE_NO_PAD.encode(y),
            })
        }
        Pair::Rsa(k) => {
            let parts = RsaPublicKeyComponents::<Vec<u8>>::from(k.public());
            json!({
                "kty": "RSA",
                "n": URL_SAFE_NO_PAD.encode(&parts.n),
                "e": URL_SAFE_NO_PAD.encode(&parts.e),
            })
        }
    }
}

/// RFC 7638: SHA-256 over the required members in lexicographic order.
fn thumbprint(jwk: &Value) -> String {
    let members: &[&str] = match jwk["kty"].as_str() {
        Some("EC") => &["crv", "kty", "x", "y"],
        Some("OKP") => &["crv", "kty", "x"],
        _ => &["e", "kty", "n"],
    };
    let body: Vec<String> = members
        .iter()
        .map(|m| format!("\"{m}\":{}", jwk[*m]))
        .collect();
    URL_SAFE_NO_PAD.encode(Sha256::digest(format!("{{{}}}", body.join(","))))
}

/// The DER inside the first PEM block labelled `label`.
fn pem_body(pem: &str, label: &str) -> Option<Vec<u8>> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let start = pem.find(&begin)? + begin.len();
    let stop = start + pem[start..].find(&end)?;
    let text: String = pem[start..stop]
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    STANDARD.decode(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An Ed25519 key (RFC 8410 §10.3's example, PKCS#8 v1 as openssl writes it).
    pub(crate) const ED25519: &str = "-----BEGIN PRIVATE KEY-----\n\
        MC4CAQAwBQYDK2VwBCIEINTuctv5E1hK1bbY8fdp+K06/nwoy/HU++CXqI9EdVhC\n\
        -----END PRIVATE KEY-----\n";

    #[test]
    fn an_ed25519_key_signs_what_its_published_half_verifies() {
        let key = SigningKey::from_pem(ED25519).expect("key");
        assert_eq!(key.alg(), "EdDSA");
        let mut claims = Map::new();
        claims.insert("sub".into(), "alice".into());
        let token = key.sign("JWT", &claims).expect("signed");
        let (input, sig) = token.rsplit_once('.').expect("jws");
        let x = key.public_jwk()["x"].as_str().expect("x");
        let public = URL_SAFE_NO_PAD.decode(x).expect("b64");
        let sig = URL_SAFE_NO_PAD.decode(sig).expect("b64");
        signature::UnparsedPublicKey::new(&signature::ED25519, public)
            .verify(input.as_bytes(), &sig)
            .expect("verifies");
        // The thumbprint is stable and is the kid the header names.
        assert_eq!(key.kid(), SigningKey::from_pem(ED25519).expect("key").kid());
        let header: Value = serde_json::from_slice(
            &URL_SAFE_NO_PAD
                .decode(token.split('.').next().expect("header"))
                .expect("b64"),
        )
        .expect("json");
        assert_eq!(header["kid"], key.kid());
        assert!(!format!("{key:?}").contains("MC4CAQ"));
    }

    #[test]
    fn what_is_not_a_pkcs8_signing_key_is_refused_with_the_reason() {
        assert!(
            SigningKey::from_pem("not a key")
                .unwrap_err()
                .contains("PKCS#8")
        );
        let junk = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";
        assert!(SigningKey::from_pem(junk).unwrap_err().contains("Ed25519"));
    }
}
