//! `[clients.<name>]` → the [`ClientTable`]: each client's key hash and
//! scopes.
//!
//! Invariants: a client name is checked like any other name; a key is only
//! ever held as its SHA-256.

use std::collections::{BTreeMap, BTreeSet};

use super::super::raw::RawConfig;
use crate::auth::{ClientTable, hash_key};

use super::{Ctx, Result, check_name};

impl Ctx<'_> {
    pub(super) fn clients(&self, raw: &RawConfig) -> Result<(ClientTable, BTreeSet<String>)> {
        let mut table = ClientTable::default();
        let mut names = BTreeSet::new();
        let mut seen: BTreeMap<[u8; 32], String> = BTreeMap::new();
        for (name, client) in &raw.clients {
            let key = format!("clients.{}", name.get_ref());
            check_name(name.get_ref()).map_err(|r| self.fail(Some(name.span()), &key, r))?;
            let digest = match (&client.api_key_sha256, &client.api_key_env) {
                (Some(_), Some(env)) => {
                    return Err(self.fail(
                        Some(env.span()),
                        &key,
                        "give either `api_key_sha256` or `api_key_env`, not both",
                    ));
                }
                (Some(sha), None) => Some(self.sha256(sha, &format!("{key}.api_key_sha256"))?),
                (None, Some(var)) => {
                    let k = format!("{key}.api_key_env");
                    let value = (self.env)(var.get_ref()).filter(|v| !v.is_empty()).ok_or_else(|| {
                        self.fail(Some(var.span()), &k, format!("the environment variable {} is not set or empty; it must hold the client's API key", var.get_ref()))
                    })?;
                    Some(hash_key(&value))
                }
                (None, None) if name.get_ref() == "anonymous" => None,
                // With [auth.jwt], a keyless client is one that tokens name.
                (None, None) if raw.auth.jwt.is_some() => {
                    table.add_token_named(name.get_ref());
                    names.insert(name.get_ref().clone());
                    continue;
                }
                (None, None) => {
                    return Err(self.fail(
                        Some(name.span()),
                        &key,
                        "the client has no key; give `api_key_sha256` or `api_key_env` (only [clients.anonymous] may have neither)",
                    ));
                }
            };
            match digest {
                Some(d) => {
                    if let Some(other) = seen.insert(d, name.get_ref().clone()) {
                        return Err(self.fail(Some(name.span()), &key, format!("this client has the same key as [clients.{other}]; each client needs its own key")));
                    }
                    if name.get_ref() == "anonymous" {
                        return Err(self.fail(Some(name.span()), &key, "[clients.anonymous] names requests without credentials and cannot have a key"));
                    }
                    table.add_keyed(name.get_ref(), d);
                }
                None => table.allow_anonymous(),
            }
            names.insert(name.get_ref().clone());
        }
        Ok((table, names))
    }
}
