//! The cache against generated interleavings of clients, servers, scopes,
//! subject tokens and expiries: it never hands a token to a key it was not
//! stored under, never after its `until`, and stays within its bounds.

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;

const CLIENTS: &[&str] = &["alice", "bob", "carol", ""];
const SERVERS: &[&str] = &["files", "mail"];
const SCOPES: &[&str] = &["", "read", "read write"];

fn key(c: usize, s: usize, sc: usize, subject: u8) -> CacheKey {
    CacheKey {
        client: Arc::from(CLIENTS[c]),
        server: Arc::from(SERVERS[s]),
        scopes: Arc::from(SCOPES[sc]),
        subject: [subject; 32],
    }
}

#[derive(Debug, Clone)]
enum Op {
    Put {
        c: usize,
        s: usize,
        sc: usize,
        subject: u8,
        ttl: u64,
    },
    Get {
        c: usize,
        s: usize,
        sc: usize,
        subject: u8,
    },
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let k = (0..CLIENTS.len(), 0..SERVERS.len(), 0..SCOPES.len(), 0u8..3);
    prop_oneof![
        (k.clone(), 0u64..5_000).prop_map(|((c, s, sc, subject), ttl)| Op::Put {
            c,
            s,
            sc,
            subject,
            ttl
        }),
        k.prop_map(|(c, s, sc, subject)| Op::Get { c, s, sc, subject }),
        (0u64..3_000).prop_map(Op::Advance),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_token_is_only_ever_handed_to_the_key_it_was_stored_under(
        ops in proptest::collection::vec(op(), 1..200),
        max in 1usize..12,
        per_client in 1usize..5,
    ) {
        let cache = TokenCache::new(max, per_client);
        // Every value ever stored, with the key and expiry it was stored under.
        let mut stored: HashMap<String, (CacheKey, u64)> = HashMap::new();
        let mut now = 0u64;
        for (n, op) in ops.into_iter().enumerate() {
            match op {
                Op::Put { c, s, sc, subject, ttl } => {
                    let k = key(c, s, sc, subject);
                    // Unique per put, naming whom it was for.
                    let value = format!("token-{n}-for-{}", CLIENTS[c]);
                    cache.put(k.clone(), Arc::from(value.as_str()), now + ttl, now);
                    stored.insert(value, (k, now + ttl));
                }
                Op::Get { c, s, sc, subject } => {
                    let k = key(c, s, sc, subject);
                    if let Some(got) = cache.get(&k, now) {
                        let (owner, until) = stored.get(&*got).expect("a value that was stored");
                        prop_assert_eq!(owner, &k, "a token stored for one key was handed to another");
                        prop_assert!(now < *until, "an expired token was handed out");
                    }
                }
                Op::Advance(dt) => now += dt,
            }
            prop_assert!(cache.len() <= max);
            for client in CLIENTS {
                prop_assert!(cache.held_by(client) <= per_client);
            }
        }
    }

    /// A client below the bound of another never loses entries to it.
    #[test]
    fn a_client_filling_the_cache_takes_from_itself_first(
        puts in 1usize..40,
    ) {
        let cache = TokenCache::new(4, 3);
        cache.put(key(0, 0, 0, 0), Arc::from("alice-1"), 1_000_000, 0);
        for i in 0..puts {
            cache.put(key(1, i % 2, i % 3, (i % 3) as u8), Arc::from("bob"), 1_000_000, 0);
        }
        let kept = cache.get(&key(0, 0, 0, 0), 1);
        prop_assert_eq!(kept.as_deref(), Some("alice-1"));
    }
}

#[test]
fn an_entry_stops_being_handed_out_at_its_until() {
    let cache = TokenCache::new(10, 10);
    let k = key(0, 0, 0, 1);
    cache.put(k.clone(), Arc::from("t"), 100, 0);
    assert_eq!(cache.get(&k, 99).as_deref(), Some("t"));
    assert_eq!(cache.get(&k, 100), None);
    assert_eq!(cache.len(), 0, "an expired entry is dropped when met");
    cache.put(k.clone(), Arc::from("late"), 5, 10);
    assert_eq!(cache.get(&k, 10), None, "nothing is stored already expired");
}
