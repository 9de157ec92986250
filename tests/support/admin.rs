//! The admin API as a test's operator sees it: one client for a gateway's
//! admin listener, holding the base URL and the operator's token, so a story
//! reads "the operator approves the first pending call" instead of repeating
//! HTTP requests.
//!
//! Every request answers `(status, body)`; a body that is not JSON reads as
//! `Value::Null`, so a test asserts on what came back rather than panicking
//! inside the harness. Polls are bounded in count.

use std::time::Duration;

use reqwest::Method;
use serde_json::Value;

use super::TestGateway;

/// An operator at one admin listener.
#[derive(Clone, Debug)]
pub struct Admin {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl TestGateway {
    /// The admin API of this gateway, as an operator holding `token`.
    pub fn admin(&self, token: &str) -> Admin {
        Admin::at(&self.admin_url(), Some(token))
    }
}

impl Admin {
    /// An operator at `base` (`http://127.0.0.1:P`), with a token or none.
    pub fn at(base: &str, token: Option<&str>) -> Self {
        Admin {
            base: base.trim_end_matches('/').to_owned(),
            token: token.map(str::to_owned),
            http: super::http(),
        }
    }

    /// One request; `body` is sent as JSON when given.
    pub async fn request(&self, method: Method, path: &str, body: Option<&Value>) -> (u16, Value) {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            req = req.bearer_auth(token);
        }
        if let Some(body) = body {
            req = req
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        let resp = req.send().await.expect("admin request");
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.request(Method::GET, path, None).await
    }

    /// `POST path` with an optional JSON body.
    pub async fn post(&self, path: &str, body: Option<&Value>) -> (u16, Value) {
        self.request(Method::POST, path, body).await
    }

    /// `GET path` as text (`/metrics`).
    pub async fn text(&self, path: &str) -> String {
        let mut req = self.http.get(format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            req = req.bearer_auth(token);
        }
        let resp = req.send().await.expect("admin request");
        resp.text().await.unwrap_or_default()
    }

    /// The operator queue: every call waiting for an operator.
    pub async fn pending(&self) -> Vec<Value> {
        let (_, body) = self.get("/api/approvals").await;
        body["approvals"].as_array().cloned().unwrap_or_default()
    }

    /// The first call of the queue, once one is there (bounded poll).
    pub async fn first_pending(&self) -> Value {
        for _ in 0..300 {
            if let Some(entry) = self.pending().await.into_iter().next() {
                return entry;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("no approval was queued at {}", self.base);
    }

    /// `approve` or `deny` one queued call.
    pub async fn decide(&self, id: &str, verb: &str) -> (u16, Value) {
        self.post(&format!("/api/approvals/{id}/{verb}"), None)
            .await
    }

    /// The events of the dashboard's live ring, newest last as the API gives them.
    pub async fn events(&self) -> Vec<Value> {
        let (_, body) = self.get("/api/events").await;
        body["events"].as_array().cloned().unwrap_or_default()
    }

    /// `POST /api/reload`, answering the status and body.
    pub async fn reload(&self) -> (u16, Value) {
        self.post("/api/reload", None).await
    }

    /// `POST /api/reload`, which must succeed.
    pub async fn reloaded(&self) {
        let (status, body) = self.reload().await;
        assert_eq!(status, 200, "reload refused: {body}");
    }

    /// `/metrics` as text.
    pub async fn metrics(&self) -> String {
        self.text("/metrics").await
    }
}
