//! The 2026-07-28 in-band approval: a `requestState` the gateway signs, and
//! the nonces it has seen used.
//!
//! Place in the path: the approval gate issues a state with its
//! `input_required` question, and checks the state a client's retry brings
//! back before anything is forwarded.
//!
//! Format: `pcl1.<base64url(claims JSON)>.<base64url(HMAC-SHA256)>`, the MAC
//! over everything before the last dot, with the gateway's own key. The
//! claims bind the client, server, tool, argument digest, a random nonce, an
//! expiry and this process's instance id.
//!
//! Invariants: the state is attacker-controlled input (the spec says so): a
//! state is believed only when its MAC verifies (in constant time, `ring`);
//! a state from another process (a restart, another replica) is refused,
//! because the used nonces are only remembered here — unless the deployment
//! shares its state ([`Signer::for_fleet`]): then every replica signs with
//! the one configured key and the deployment's instance id, and the nonces
//! are used once through [`crate::state::SharedState`]; a nonce is consumed at
//! most once, and while the used-nonce table is full of unexpired nonces no
//! new one can be consumed (the call is refused: fail closed, never forget a
//! use early); one client holds at most `max_used_per_client` of them, so a
//! client that floods the table is refused itself and never fills it for
//! another client.

use std::collections::HashMap;
use std::sync::Mutex;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::hmac;
use serde::{Deserialize, Serialize};

use super::binding::Binding;

/// What every state the gateway signs starts with.
pub const PREFIX: &str = "pcl1.";
/// Longest state accepted back: the claims, and what they carry of an
/// upstream's own input round ([`MAX_CARRIED_BYTES`]), base64url-encoded.
const MAX_STATE_BYTES: usize = 96 * 1024;
/// Most bytes (JSON) of an upstream's `requestState` and `inputResponses` a
/// state carries across the gateway's question.
pub const MAX_CARRIED_BYTES: usize = 48 * 1024;

/// What a signed state says.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct Claims {
    /// Client.
    c: String,
    /// Server.
    s: String,
    /// Tool.
    t: String,
    /// Argument digest, hex.
    d: String,
    /// Nonce, hex.
    n: String,
    /// Expiry, Unix ms.
    e: i64,
    /// Instance id of the process that signed it, hex.
    i: String,
    /// What the call carried of the upstream's own input round (its
    /// `requestState`, its answers), given back to it once approved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    u: Option<serde_json::Value>,
}

/// Why a presented state is not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateRefusal {
    /// Not one the gateway signed (bad form or MAC), or signed by another
    /// process, or for another client, server or tool: one answer for all.
    Invalid,
    /// Past its expiry.
    Expired,
    /// Its nonce was used already.
    Used,
    /// The used-nonce table is full of unexpired nonces.
    Full,
    /// This client holds its bound of unexpired used nonces.
    ClientFull,
}

/// A verified state for this call: its nonce can be consumed.
#[derive(Debug)]
pub struct Verified {
    nonce: String,
    client: String,
    expires_ms: i64,
    /// The arguments are those that were approved.
    pub same_arguments: bool,
    /// The upstream's own input round the call carried when it was asked.
    pub carried: Option<serde_json::Value>,
}

/// Signs and checks states; remembers used nonces.
pub struct Signer {
    key: hmac::Key,
    instance: String,
    /// Used nonces: whose, and until when they are remembered.
    used: Mutex<HashMap<String, (String, i64)>>,
    max_used: usize,
    max_used_per_client: usize,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

impl Signer {
    /// A signer with `key` (at least 32 bytes), or a random key.
    pub fn new(key: Option<&[u8]>, max_used: usize, max_used_per_client: usize) -> Self {
        let generated;
        let key = match key {
            Some(k) => k,
            None => {
                generated = rand::random::<[u8; 32]>();
                &generated[..]
            }
        };
        Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, key),
            instance: hex::encode(rand::random::<[u8; 16]>()),
            used: Mutex::new(HashMap::new()),
            max_used,
            max_used_per_client,
        }
    }

    /// A signer every replica of the deployment `namespace` shares: the
    /// same `key` (the configuration requires one), one instance id, so a
    /// state signed by one replica verifies on every other.
    pub fn for_fleet(
        key: &[u8],
        namespace: &str,
        max_used: usize,
        max_used_per_client: usize,
    ) -> Self {
        let mut signer = Self::new(Some(key), max_used, max_used_per_client);
        signer.instance = format!("fleet-{namespace}");
        signer
    }

    /// The nonce, its client and its expiry: what the shared store keeps.
    pub fn nonce_of(verified: &Verified) -> (&str, &str, i64) {
        (&verified.nonce, &verified.client, verified.expires_ms)
    }

    /// A new state for `binding`, usable until `expires_ms`, carrying
    /// `carried` (at most [`MAX_CARRIED_BYTES`]: the caller checks).
    pub fn issue(
        &self,
        binding: &Binding,
        expires_ms: i64,
        carried: Option<serde_json::Value>,
    ) -> String {
        let claims = Claims {
            c: binding.client.clone(),
            s: binding.server.clone(),
            t: binding.tool.clone(),
            d: binding.digest_hex(),
            n: hex::encode(rand::random::<[u8; 16]>()),
            e: expires_ms,
            i: self.instance.clone(),
            u: carried,
        };
        let json = serde_json::to_vec(&claims).unwrap_or_default();
        let signed = format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(json));
        let tag = hmac::sign(&self.key, signed.as_bytes());
        format!("{signed}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
    }

    /// Whether `state` is one of the gateway's (by its prefix alone).
    pub fn is_ours(state: &str) -> bool {
        state.starts_with(PREFIX)
    }

    /// Checks a presented state against this call: the MAC, the process, the
    /// client, server and tool, the expiry and whether its nonce was used.
    /// The arguments are compared but a mismatch is not a refusal: the caller
    /// asks again for the new arguments and the old state stays unused.
    pub fn verify(
        &self,
        state: &str,
        binding: &Binding,
        now_ms: i64,
    ) -> Result<Verified, StateRefusal> {
        let claims = self.open(state).ok_or(StateRefusal::Invalid)?;
        let same_call = claims.i == self.instance
            && claims.c == binding.client
            && claims.s == binding.server
            && claims.t == binding.tool;
        if !same_call {
            return Err(StateRefusal::Invalid);
        }
        if self.lock().contains_key(&claims.n) {
            return Err(StateRefusal::Used);
        }
        if now_ms >= claims.e {
            return Err(StateRefusal::Expired);
        }
        Ok(Verified {
            carried: claims.u,
            same_arguments: claims.d == binding.digest_hex(),
            nonce: claims.n,
            client: claims.c,
            expires_ms: claims.e,
        })
    }

    /// Uses a verified state: from now on it is refused as used.
    pub fn consume(&self, verified: &Verified, now_ms: i64) -> Result<(), StateRefusal> {
        let mut used = self.lock();
        if used.contains_key(&verified.nonce) {
            return Err(StateRefusal::Used);
        }
        let mine = |used: &HashMap<String, (String, i64)>| {
            used.values()
                .filter(|(client, _)| *client == verified.client)
                .count()
        };
        if used.len() >= self.max_used || mine(&used) >= self.max_used_per_client {
            used.retain(|_, (_, expiry)| *expiry > now_ms);
            if used.len() >= self.max_used {
                return Err(StateRefusal::Full);
            }
            if mine(&used) >= self.max_used_per_client {
                return Err(StateRefusal::ClientFull);
            }
        }
        used.insert(
            verified.nonce.clone(),
            (verified.client.clone(), verified.expires_ms),
        );
        Ok(())
    }

    fn open(&self, state: &str) -> Option<Claims> {
        if state.len() > MAX_STATE_BYTES || !state.starts_with(PREFIX) {
            return None;
        }
        let (signed, tag) = state.rsplit_once('.')?;
        let tag = URL_SAFE_NO_PAD.decode(tag).ok()?;
        hmac::verify(&self.key, signed.as_bytes(), &tag).ok()?;
        let body = URL_SAFE_NO_PAD.decode(&signed[PREFIX.len()..]).ok()?;
        serde_json::from_slice(&body).ok()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (String, i64)>> {
        self.used.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(client: &str, args: serde_json::Value) -> Binding {
        Binding::new(client, "files", "delete_file", &args)
    }

    #[test]
    fn a_state_verifies_once_for_its_own_call_only() {
        let signer = Signer::new(Some(&[7u8; 32]), 10, 10);
        let alice = call("alice", json!({"path": "/tmp/x"}));
        let state = signer.issue(&alice, 1_000, None);
        let ok = signer.verify(&state, &alice, 10).expect("valid");
        assert!(ok.same_arguments);
        // Other arguments: verified, but not the approved ones.
        let other = call("alice", json!({"path": "/"}));
        assert!(!signer.verify(&state, &other, 10).unwrap().same_arguments);
        assert_eq!(
            signer
                .verify(&state, &call("bob", json!({"path": "/tmp/x"})), 10)
                .unwrap_err(),
            StateRefusal::Invalid
        );
        assert_eq!(
            signer.verify(&state, &alice, 1_000).unwrap_err(),
            StateRefusal::Expired
        );
        signer.consume(&ok, 10).expect("first use");
        assert_eq!(
            signer.verify(&state, &alice, 10).unwrap_err(),
            StateRefusal::Used
        );
        assert_eq!(signer.consume(&ok, 10).unwrap_err(), StateRefusal::Used);
    }

    #[test]
    fn a_changed_byte_another_key_or_another_process_is_invalid() {
        let signer = Signer::new(Some(&[7u8; 32]), 10, 10);
        let alice = call("alice", json!({}));
        let state = signer.issue(&alice, i64::MAX, None);
        let mut forged = state.clone().into_bytes();
        let at = PREFIX.len() + 3;
        forged[at] = if forged[at] == b'A' { b'B' } else { b'A' };
        let forged = String::from_utf8(forged).unwrap();
        assert_eq!(
            signer.verify(&forged, &alice, 0).unwrap_err(),
            StateRefusal::Invalid
        );
        // Same key, another process (a restart): its nonces are not known here.
        let restarted = Signer::new(Some(&[7u8; 32]), 10, 10);
        assert_eq!(
            restarted.verify(&state, &alice, 0).unwrap_err(),
            StateRefusal::Invalid
        );
        let other_key = Signer::new(Some(&[8u8; 32]), 10, 10);
        assert_eq!(
            other_key.verify(&state, &alice, 0).unwrap_err(),
            StateRefusal::Invalid
        );
        for junk in ["", "pcl1.", "pcl1.x.y", "upstream-state"] {
            assert_eq!(
                signer.verify(junk, &alice, 0).unwrap_err(),
                StateRefusal::Invalid
            );
        }
    }

    #[test]
    fn a_fleet_state_verifies_on_every_replica_of_its_deployment_only() {
        let key = [7u8; 32];
        let one = Signer::for_fleet(&key, "prod", 10, 10);
        let two = Signer::for_fleet(&key, "prod", 10, 10);
        let staging = Signer::for_fleet(&key, "staging", 10, 10);
        let alice = call("alice", json!({}));
        let state = one.issue(&alice, i64::MAX, None);
        assert!(two.verify(&state, &alice, 0).is_ok());
        assert_eq!(
            staging.verify(&state, &alice, 0).unwrap_err(),
            StateRefusal::Invalid
        );
        let own = Signer::new(Some(&key), 10, 10);
        assert_eq!(
            own.verify(&state, &alice, 0).unwrap_err(),
            StateRefusal::Invalid
        );
    }

    #[test]
    fn a_full_table_of_unexpired_nonces_refuses_new_uses() {
        let signer = Signer::new(None, 1, 1);
        let a = call("alice", json!({"n": 1}));
        let first = signer.verify(&signer.issue(&a, 100, None), &a, 0).unwrap();
        signer.consume(&first, 0).unwrap();
        let second = signer.verify(&signer.issue(&a, 100, None), &a, 0).unwrap();
        assert_eq!(signer.consume(&second, 50).unwrap_err(), StateRefusal::Full);
        // Once the first has expired its place is free.
        signer.consume(&second, 100).unwrap();
    }

    #[test]
    fn one_clients_used_nonces_never_fill_the_table_for_another() {
        let signer = Signer::new(None, 10, 2);
        let a = call("alice", json!({"n": 1}));
        let b = call("bob", json!({"n": 1}));
        for _ in 0..2 {
            let v = signer.verify(&signer.issue(&a, 100, None), &a, 0).unwrap();
            signer.consume(&v, 0).unwrap();
        }
        let third = signer.verify(&signer.issue(&a, 100, None), &a, 0).unwrap();
        assert_eq!(
            signer.consume(&third, 0).unwrap_err(),
            StateRefusal::ClientFull
        );
        let bobs = signer.verify(&signer.issue(&b, 100, None), &b, 0).unwrap();
        signer.consume(&bobs, 0).unwrap();
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn json() -> impl Strategy<Value = serde_json::Value> {
            let leaf = prop_oneof![
                any::<bool>().prop_map(serde_json::Value::from),
                any::<i64>().prop_map(serde_json::Value::from),
                any::<u64>().prop_map(serde_json::Value::from),
                "[ -~]{0,8}".prop_map(serde_json::Value::from),
            ];
            leaf.prop_recursive(3, 24, 4, |inner| {
                prop_oneof![
                    proptest::collection::vec(inner.clone(), 0..4)
                        .prop_map(serde_json::Value::from),
                    proptest::collection::btree_map("[a-z]{1,3}", inner, 0..4)
                        .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
                ]
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(500))]

            /// A state verifies for exactly the binding it was issued for:
            /// another client, server or tool is invalid, other arguments are
            /// "not the approved ones" unless they are the same JSON value.
            #[test]
            fn a_state_is_for_its_own_binding_only(
                a in json(), b in json(),
                client in "[a-c]{1,2}", other_client in "[a-c]{1,2}",
                tool in "[x-z]{1,2}", other_tool in "[x-z]{1,2}",
            ) {
                let signer = Signer::new(None, 10, 10);
                let issued = Binding::new(&client, "s", &tool, &a);
                let state = signer.issue(&issued, i64::MAX, None);
                let presented = Binding::new(&other_client, "s", &other_tool, &b);
                match signer.verify(&state, &presented, 0) {
                    Ok(v) => {
                        prop_assert!(client == other_client && tool == other_tool);
                        prop_assert_eq!(v.same_arguments, issued.digest == presented.digest);
                        if a == b {
                            prop_assert!(v.same_arguments);
                        }
                    }
                    Err(e) => {
                        prop_assert_eq!(e, StateRefusal::Invalid);
                        prop_assert!(client != other_client || tool != other_tool);
                    }
                }
            }

            /// Changing any one byte of a state makes it invalid.
            #[test]
            fn any_changed_byte_is_invalid(a in json(), at in any::<prop::sample::Index>(), to in 0x21u8..0x7f) {
                let signer = Signer::new(None, 10, 10);
                let b = Binding::new("alice", "s", "t", &a);
                let state = signer.issue(&b, i64::MAX, None);
                let mut bytes = state.clone().into_bytes();
                let i = at.index(bytes.len());
                prop_assume!(bytes[i] != to);
                bytes[i] = to;
                let forged = String::from_utf8(bytes).expect("ascii");
                prop_assert_eq!(signer.verify(&forged, &b, 0).unwrap_err(), StateRefusal::Invalid);
            }

            /// Any value changed inside the arguments changes the digest.
            #[test]
            fn any_changed_value_changes_the_digest(a in json(), key in "[a-z]{1,3}", v in json()) {
                let mut changed = serde_json::json!({"args": a.clone()});
                let before = changed.clone();
                if changed["args"].get(&key) == Some(&v) {
                    return Ok(());
                }
                match &mut changed["args"] {
                    serde_json::Value::Object(m) => { m.insert(key, v); }
                    other => { *other = serde_json::json!({key: v}); }
                }
                prop_assume!(changed != before);
                prop_assert_ne!(super::super::super::binding::digest(&before), super::super::super::binding::digest(&changed));
            }
        }
    }
}
