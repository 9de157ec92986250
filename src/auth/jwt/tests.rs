use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Map, Value, json};

use super::keys::Pick;
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
    let ed =
        json!({"kty": "OKP", "crv": "Ed25519", "x": URL_SAFE_NO_PAD.encode([7u8; 32]), "kid": "e"});
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
