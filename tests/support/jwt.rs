//! Signing keys and tokens for the JWT tests, and a tiny JWKS server.
//!
//! Keys are real: RSA from `tests/fixtures/jwt/rsa-2048.pem` (see the README
//! there), EC P-256 and Ed25519 generated per test. Tokens are signed with
//! ring, the gateway's own signature library, but through nothing the gateway
//! shares: header, claims and signature are assembled here by hand.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, Ed25519KeyPair, KeyPair as _, RsaKeyPair};
use serde_json::{Value, json};

/// A private key with its `kid`.
pub struct Signer {
    pub kid: String,
    key: Key,
}

enum Key {
    Rsa(RsaKeyPair),
    Ec(EcdsaKeyPair),
    Ed(Ed25519KeyPair),
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Signer({} {})", self.alg(), self.kid)
    }
}

impl Signer {
    /// The RSA key of `tests/fixtures/jwt/rsa-2048.pem` (RS256).
    pub fn rsa(kid: &str) -> Self {
        let pem = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/jwt/rsa-2048.pem"),
        )
        .expect("the RSA test key");
        let b64: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        let der = STANDARD.decode(b64).expect("PEM body");
        Self {
            kid: kid.into(),
            key: Key::Rsa(RsaKeyPair::from_pkcs8(&der).expect("an RSA PKCS#8 key")),
        }
    }

    /// A new P-256 key (ES256).
    pub fn ec(kid: &str) -> Self {
        let rng = SystemRandom::new();
        let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).expect("EC key");
        Self {
            kid: kid.into(),
            key: Key::Ec(EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).expect("EC key")),
        }
    }

    /// A new Ed25519 key (EdDSA).
    pub fn ed25519(kid: &str) -> Self {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).expect("Ed25519 key");
        Self {
            kid: kid.into(),
            key: Key::Ed(Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("Ed25519 key")),
        }
    }

    pub fn alg(&self) -> &'static str {
        match self.key {
            Key::Rsa(_) => "RS256",
            Key::Ec(_) => "ES256",
            Key::Ed(_) => "EdDSA",
        }
    }

    /// The bytes of the public key as a naive verifier would hold them (DER
    /// for RSA): what an HMAC-confusion attack uses as the "secret".
    pub fn public_bytes(&self) -> Vec<u8> {
        match &self.key {
            Key::Rsa(k) => k.public_key().as_ref().to_vec(),
            Key::Ec(k) => k.public_key().as_ref().to_vec(),
            Key::Ed(k) => k.public_key().as_ref().to_vec(),
        }
    }

    /// The public JWK.
    pub fn jwk(&self) -> Value {
        let b64 = |b: &[u8]| URL_SAFE_NO_PAD.encode(b);
        match &self.key {
            Key::Rsa(k) => {
                let (n, e) = rsa_public_numbers(k.public_key().as_ref());
                json!({"kty": "RSA", "kid": self.kid, "alg": "RS256", "use": "sig", "n": b64(&n), "e": b64(&e)})
            }
            Key::Ec(k) => {
                let point = k.public_key().as_ref();
                json!({"kty": "EC", "kid": self.kid, "crv": "P-256", "x": b64(&point[1..33]), "y": b64(&point[33..65])})
            }
            Key::Ed(k) => {
                json!({"kty": "OKP", "kid": self.kid, "crv": "Ed25519", "x": b64(k.public_key().as_ref())})
            }
        }
    }

    /// A token with this key's `alg` and `kid`.
    pub fn token(&self, claims: &Value) -> String {
        self.sign_with_header(
            &json!({"alg": self.alg(), "typ": "JWT", "kid": self.kid}),
            claims,
        )
    }

    /// Signs `header.claims` as given (the header is not checked against the key).
    pub fn sign_with_header(&self, header: &Value, claims: &Value) -> String {
        let input = signing_input(header, claims);
        let rng = SystemRandom::new();
        let sig = match &self.key {
            Key::Rsa(k) => {
                let mut sig = vec![0; k.public().modulus_len()];
                k.sign(
                    &signature::RSA_PKCS1_SHA256,
                    &rng,
                    input.as_bytes(),
                    &mut sig,
                )
                .expect("RSA signature");
                sig
            }
            Key::Ec(k) => k
                .sign(&rng, input.as_bytes())
                .expect("EC signature")
                .as_ref()
                .to_vec(),
            Key::Ed(k) => k.sign(input.as_bytes()).as_ref().to_vec(),
        };
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig))
    }
}

/// `base64url(header).base64url(claims)`.
pub fn signing_input(header: &Value, claims: &Value) -> String {
    format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    )
}

/// An HS256 token whose HMAC secret is `secret`.
pub fn hs256(kid: &str, secret: &[u8], claims: &Value) -> String {
    let input = signing_input(&json!({"alg": "HS256", "typ": "JWT", "kid": kid}), claims);
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
    let tag = ring::hmac::sign(&key, input.as_bytes());
    format!("{input}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
}

/// An unsigned token (`alg: none`, empty signature).
pub fn unsigned(kid: &str, claims: &Value) -> String {
    format!(
        "{}.",
        signing_input(&json!({"alg": "none", "typ": "JWT", "kid": kid}), claims)
    )
}

/// `token` with its payload replaced by `claims`, signature kept.
pub fn tampered(token: &str, claims: &Value) -> String {
    let parts: Vec<&str> = token.split('.').collect();
    format!(
        "{}.{}.{}",
        parts[0],
        URL_SAFE_NO_PAD.encode(claims.to_string()),
        parts[2]
    )
}

/// A JWKS document with the public keys of `signers`.
pub fn jwks(signers: &[&Signer]) -> String {
    json!({"keys": signers.iter().map(|s| s.jwk()).collect::<Vec<_>>()}).to_string()
}

/// Seconds since the epoch.
pub fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs() as i64
}

/// Claims valid for five minutes, from `iss` for `aud`, naming `sub`.
pub fn claims(iss: &str, aud: &str, sub: &str, scope: &str) -> Value {
    let now = now();
    json!({"iss": iss, "aud": aud, "sub": sub, "scope": scope, "iat": now, "nbf": now - 5, "exp": now + 300})
}

/// `n` and `e` of a DER `RSAPublicKey` (SEQUENCE { INTEGER n, INTEGER e }).
fn rsa_public_numbers(der: &[u8]) -> (Vec<u8>, Vec<u8>) {
    fn tlv(der: &[u8], tag: u8) -> (&[u8], &[u8]) {
        assert_eq!(der[0], tag, "DER tag");
        let (len, skip) = match der[1] {
            l if l < 0x80 => (l as usize, 2),
            l => {
                let n = (l & 0x7f) as usize;
                let len = der[2..2 + n]
                    .iter()
                    .fold(0usize, |a, b| (a << 8) | *b as usize);
                (len, 2 + n)
            }
        };
        (&der[skip..skip + len], &der[skip + len..])
    }
    let (seq, _) = tlv(der, 0x30);
    let (n, rest) = tlv(seq, 0x02);
    let (e, _) = tlv(rest, 0x02);
    let strip = |b: &[u8]| {
        b.iter()
            .skip_while(|x| **x == 0)
            .copied()
            .collect::<Vec<u8>>()
    };
    (strip(n), strip(e))
}

/// A loopback HTTP server answering `GET /jwks.json` with a document the test
/// can swap, counting requests; `GET /moved` redirects there.
#[derive(Debug)]
pub struct JwksServer {
    pub url: String,
    doc: Arc<Mutex<String>>,
    hits: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl JwksServer {
    pub async fn start(doc: String) -> Self {
        let doc = Arc::new(Mutex::new(doc));
        let hits = Arc::new(AtomicUsize::new(0));
        let (d, h) = (doc.clone(), hits.clone());
        let app = axum::Router::new()
            .route(
                "/jwks.json",
                axum::routing::get(move || {
                    let (d, h) = (d.clone(), h.clone());
                    async move {
                        h.fetch_add(1, Ordering::SeqCst);
                        let body = d.lock().expect("doc").clone();
                        ([("content-type", "application/json")], body)
                    }
                }),
            )
            // A redirect to the real document, which a careful fetcher does not follow.
            .route(
                "/moved",
                axum::routing::get(|| async {
                    (http::StatusCode::FOUND, [("location", "/jwks.json")], "")
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            url: format!("http://{addr}/jwks.json"),
            doc,
            hits,
            task,
        }
    }

    /// Serves `doc` from now on.
    pub fn set(&self, doc: String) {
        *self.doc.lock().expect("doc") = doc;
    }

    /// Requests served so far.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

impl Drop for JwksServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
