//! Asking a token endpoint for a token: the RFC 8693 token exchange (the
//! client's JWT as `subject_token`) and the client-credentials grant, with
//! the gateway authenticating as `client_secret_basic`, `client_secret_post`
//! or `private_key_jwt` (RFC 7523), and RFC 8707 `resource`.
//!
//! Place: beneath the [`super::Broker`], on a cache miss.
//!
//! Invariants: the endpoint comes from the configuration alone (https, or
//! http on loopback, checked at load), redirects are never followed and no
//! environment proxy is used; every wait and read is bounded; what the
//! authorization server says is never logged nor shown beyond its RFC 6749
//! `error` code (a body could echo the subject token), and no token, secret
//! or assertion is ever part of an error's text.

use std::sync::OnceLock;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value};

use super::credential::CredentialError;
use super::settings::{ClientAuth, GrantSettings};
use super::signer::{SigningKey, new_jti, now_secs};
use super::template::header_safe;

/// The largest token endpoint answer read.
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// `grant_type` of RFC 8693.
pub(crate) const TOKEN_EXCHANGE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
/// RFC 8693's type of the token asked for.
const ACCESS_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:access_token";
/// RFC 7523's client assertion type.
const JWT_BEARER: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";

/// A token the endpoint issued.
#[derive(Clone)]
pub(crate) struct Issued {
    pub(crate) token: String,
    /// `expires_in`, when the endpoint said.
    pub(crate) expires_in: Option<Duration>,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued")
            .field("expires_in", &self.expires_in)
            .finish_non_exhaustive()
    }
}

/// What to ask for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Ask<'a> {
    /// Exchange this subject token (RFC 8693).
    Exchange { subject_token: &'a str },
    /// A token of the gateway's own (client credentials).
    Service,
}

/// The HTTP client of token endpoints: no redirects, no proxy.
fn client() -> Result<&'static reqwest::Client, CredentialError> {
    static CLIENT: OnceLock<Option<reqwest::Client>> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .no_proxy()
                .build()
                .ok()
        })
        .as_ref()
        .ok_or_else(|| CredentialError {
            reason: "the gateway could not build its HTTP client for token endpoints".into(),
            retry_helps: false,
        })
}

/// Asks `grant`'s endpoint for a token for `resource`; `key` signs the
/// client assertion under `private_key_jwt`.
pub(crate) async fn request(
    grant: &GrantSettings,
    ask: Ask<'_>,
    resource: &str,
    key: Option<&SigningKey>,
    server: &str,
) -> Result<Issued, CredentialError> {
    let endpoint = grant.endpoint.as_str();
    let mut form: Vec<(&str, String)> = Vec::new();
    match ask {
        Ask::Exchange { subject_token } => {
            form.push(("grant_type", TOKEN_EXCHANGE.into()));
            form.push(("subject_token", subject_token.into()));
            form.push(("subject_token_type", grant.subject_token_type.clone()));
            form.push(("requested_token_type", ACCESS_TOKEN_TYPE.into()));
        }
        Ask::Service => form.push(("grant_type", "client_credentials".into())),
    }
    form.push(("resource", resource.into()));
    if let Some(audience) = &grant.audience {
        form.push(("audience", audience.clone()));
    }
    if !grant.scopes.is_empty() {
        form.push(("scope", grant.scopes.join(" ")));
    }
    let mut basic = None;
    match &grant.auth {
        ClientAuth::Basic(secret) => {
            let pair = format!(
                "{}:{}",
                form_encode(&grant.client_id),
                form_encode(secret.expose())
            );
            basic = Some(format!("Basic {}", STANDARD.encode(pair)));
        }
        ClientAuth::Post(secret) => {
            form.push(("client_id", grant.client_id.clone()));
            form.push(("client_secret", secret.expose().to_owned()));
        }
        ClientAuth::PrivateKeyJwt => {
            let key = key.ok_or_else(|| CredentialError {
                reason: "`private_key_jwt` needs a key in `[identity] signing_keys`".into(),
                retry_helps: false,
            })?;
            form.push(("client_id", grant.client_id.clone()));
            form.push(("client_assertion_type", JWT_BEARER.into()));
            form.push((
                "client_assertion",
                client_assertion(key, &grant.client_id, endpoint)?,
            ));
        }
    }
    let body = form
        .iter()
        .map(|(k, v)| format!("{}={}", form_encode(k), form_encode(v)))
        .collect::<Vec<_>>()
        .join("&");
    let mut request = client()?
        .post(grant.endpoint.clone())
        .header(
            http::header::CONTENT_TYPE,
            "application/x-www-form-urlencoded",
        )
        .header(http::header::ACCEPT, "application/json")
        .body(body);
    if let Some(basic) = basic {
        request = request.header(http::header::AUTHORIZATION, basic);
    }
    let unreachable = |what: &str| CredentialError {
        reason: format!(
            "the authorization server's token endpoint {endpoint} {what}; the operator should check that it runs \
             and that `servers.{server}.identity.token_endpoint` names it"
        ),
        retry_helps: true,
    };
    let answer = async {
        let response = request.send().await.map_err(|e| {
            unreachable(if e.is_connect() {
                "could not be reached (the connection failed)"
            } else {
                "did not answer (the request failed)"
            })
        })?;
        let status = response.status();
        let mut body = Vec::new();
        let mut response = response;
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|_| unreachable("broke off its answer"))?
        {
            if body.len() + chunk.len() > MAX_ANSWER_BYTES {
                return Err(unreachable("answered with more than 64 KiB"));
            }
            body.extend_from_slice(&chunk);
        }
        Ok((status, body))
    };
    let (status, body) = tokio::time::timeout(grant.timeout, answer)
        .await
        .map_err(|_| unreachable("did not answer in time"))??;
    let json: Option<Map<String, Value>> = serde_json::from_slice(&body).ok();
    if status.is_success() {
        return issued(json, endpoint);
    }
    Err(refused(
        status,
        json.as_ref(),
        endpoint,
        server,
        matches!(ask, Ask::Exchange { .. }),
    ))
}

/// The token of a successful answer.
fn issued(json: Option<Map<String, Value>>, endpoint: &str) -> Result<Issued, CredentialError> {
    let unreadable = || CredentialError {
        reason: format!(
            "the token endpoint {endpoint} answered without a usable `access_token` (it must be one line of \
             visible ASCII); the operator should check the authorization server"
        ),
        retry_helps: false,
    };
    let json = json.ok_or_else(unreadable)?;
    let token = json
        .get("access_token")
        .and_then(Value::as_str)
        .filter(|t| header_safe(t).is_ok())
        .ok_or_else(unreadable)?;
    let expires_in = json
        .get("expires_in")
        .and_then(Value::as_f64)
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(|s| Duration::from_secs_f64(s.min(365.0 * 86_400.0)));
    Ok(Issued {
        token: token.to_owned(),
        expires_in,
    })
}

/// A refusal in words: what the operator or the client must do, and whether
/// a retry helps. Only the RFC 6749 `error` code is quoted, and only when it
/// has the form the RFC gives it.
fn refused(
    status: http::StatusCode,
    json: Option<&Map<String, Value>>,
    endpoint: &str,
    server: &str,
    exchange: bool,
) -> CredentialError {
    let code = json
        .and_then(|j| j.get("error"))
        .and_then(Value::as_str)
        .filter(|c| {
            !c.is_empty()
                && c.len() <= 64
                && c.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        });
    let at = format!(
        "the authorization server ({endpoint}) answered HTTP {}",
        status.as_u16()
    );
    let key = format!("servers.{server}.identity");
    let (reason, retry_helps) = match code {
        Some("invalid_grant") if exchange => (
            format!(
                "{at} invalid_grant: it refused to exchange the client's token (expired, revoked, or not issued \
                 for this gateway). The client must obtain a new token; retrying with the same one will not help"
            ),
            false,
        ),
        Some("invalid_client") | Some("unauthorized_client") => (
            format!(
                "{at} {}: it does not accept the gateway's own client credentials for this grant. The operator \
                 must fix `{key}.client_id`, its secret or key, or the client's registration",
                code.unwrap_or_default()
            ),
            false,
        ),
        Some(
            c @ ("invalid_target" | "invalid_scope" | "invalid_request" | "unsupported_grant_type"),
        ) => (
            format!(
                "{at} {c}: the request the gateway is configured to make is refused. The operator must check \
                 `{key}` (resource, audience, scopes) against the authorization server's configuration"
            ),
            false,
        ),
        _ if status.is_redirection() => (
            format!(
                "{at}: a redirect, which the gateway does not follow. The operator must set `{key}.token_endpoint` \
                 to the endpoint's final address"
            ),
            false,
        ),
        _ if status.is_server_error() || status == http::StatusCode::TOO_MANY_REQUESTS => (
            format!("{at}: it is failing or overloaded. Retrying later may help"),
            true,
        ),
        Some(c) => (
            format!(
                "{at} {c}. The operator should check `{key}` and the authorization server's log"
            ),
            false,
        ),
        None => (
            format!(
                "{at} without an OAuth error. The operator should check `{key}` and the authorization server's log"
            ),
            false,
        ),
    };
    CredentialError {
        reason,
        retry_helps,
    }
}

/// RFC 7523 client assertion: `iss` = `sub` = the client id, `aud` = the endpoint.
fn client_assertion(
    key: &SigningKey,
    client_id: &str,
    endpoint: &str,
) -> Result<String, CredentialError> {
    let now = now_secs();
    let mut claims = Map::new();
    claims.insert("iss".into(), client_id.into());
    claims.insert("sub".into(), client_id.into());
    claims.insert("aud".into(), endpoint.into());
    claims.insert("iat".into(), now.into());
    claims.insert("exp".into(), (now + 60).into());
    claims.insert("jti".into(), new_jti().into());
    key.sign("JWT", &claims).map_err(|why| CredentialError {
        reason: format!("the gateway could not sign its client assertion: {why}"),
        retry_helps: false,
    })
}

/// `application/x-www-form-urlencoded` of one name or value.
fn form_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'*' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_encoding_escapes_what_a_form_cannot_carry() {
        assert_eq!(form_encode("a b&c=d/é"), "a+b%26c%3Dd%2F%C3%A9");
        assert_eq!(form_encode("Az09-._*"), "Az09-._*");
    }

    #[test]
    fn refusals_say_who_must_act_and_whether_a_retry_helps() {
        let json = |code: &str| {
            let mut m = Map::new();
            m.insert("error".into(), code.into());
            m.insert("error_description".into(), "echo eyJ.secret.token".into());
            m
        };
        let bad = http::StatusCode::BAD_REQUEST;
        let grant = refused(
            bad,
            Some(&json("invalid_grant")),
            "https://as/token",
            "files",
            true,
        );
        assert!(!grant.retry_helps && grant.reason.contains("client must obtain a new token"));
        let client = refused(
            http::StatusCode::UNAUTHORIZED,
            Some(&json("invalid_client")),
            "https://as/token",
            "files",
            true,
        );
        assert!(client.reason.contains("servers.files.identity.client_id"));
        let down = refused(
            http::StatusCode::SERVICE_UNAVAILABLE,
            None,
            "https://as/token",
            "files",
            true,
        );
        assert!(down.retry_helps);
        let odd = refused(
            bad,
            Some(&json("bad\r\ncode")),
            "https://as/token",
            "files",
            true,
        );
        for e in [grant, client, down, odd] {
            assert!(
                !e.reason.contains("secret.token") && !e.reason.contains('\n'),
                "{}",
                e.reason
            );
        }
    }
}
