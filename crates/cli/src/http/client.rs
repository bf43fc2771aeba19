//! The command line's client of the HTTP API: one JSON request, one JSON answer, and an
//! error that reads as one line.

use std::net::SocketAddr;

use anyhow::{Context as _, bail};
use serde_json::Value;

/// A client of one server.
pub struct Client {
    base: String,
    http: reqwest::Client,
    token: Option<String>,
}

impl Client {
    /// A client of the server at `addr`.
    pub fn new(addr: SocketAddr) -> Self {
        Client { base: format!("http://{addr}"), http: reqwest::Client::new(), token: None }
    }

    /// The same client, sending `token` as `Authorization: Bearer`.
    pub fn with_token(mut self, token: Option<String>) -> Self {
        self.token = token;
        self
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let req = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(token) => req.bearer_auth(token),
            None => req,
        }
    }

    /// A client whose every request gives up after `timeout`.
    pub fn with_timeout(addr: SocketAddr, timeout: std::time::Duration) -> Self {
        let http = reqwest::Client::builder().timeout(timeout).build().unwrap_or_default();
        Client { base: format!("http://{addr}"), http, token: None }
    }

    /// Whether the server answers `/health`.
    pub async fn is_up(&self) -> bool {
        self.http.get(format!("{}/health", self.base)).send().await.is_ok_and(|r| r.status().is_success())
    }

    async fn answer(response: reqwest::Response) -> anyhow::Result<Value> {
        let status = response.status();
        let body: Value = response.json().await.context("the server's answer is not JSON")?;
        if !status.is_success() {
            bail!("{}", body["error"].as_str().unwrap_or("request failed"));
        }
        Ok(body)
    }

    /// GET `path`.
    pub async fn get(&self, path: &str) -> anyhow::Result<Value> {
        let r = self.request(reqwest::Method::GET, path).send().await.context("server unreachable")?;
        Self::answer(r).await
    }

    /// GET `path` with `query` pairs, encoded by reqwest.
    pub async fn get_query(&self, path: &str, query: &[(&str, String)]) -> anyhow::Result<Value> {
        let r = self
            .request(reqwest::Method::GET, path)
            .query(query)
            .send()
            .await
            .context("server unreachable")?;
        Self::answer(r).await
    }

    /// GET `path` as raw bytes (a backup).
    pub async fn get_bytes(&self, path: &str) -> anyhow::Result<Vec<u8>> {
        let r = self.request(reqwest::Method::GET, path).send().await.context("server unreachable")?;
        if !r.status().is_success() {
            let body: Value = r.json().await.unwrap_or(Value::Null);
            bail!("{}", body["error"].as_str().unwrap_or("request failed"));
        }
        Ok(r.bytes().await.context("reading the answer")?.to_vec())
    }

    /// POST `body` to `path`, with an optional idempotency key.
    pub async fn post(&self, path: &str, body: &Value, key: Option<&str>) -> anyhow::Result<Value> {
        let mut req = self.request(reqwest::Method::POST, path).json(body);
        if let Some(key) = key {
            req = req.header("Idempotency-Key", key);
        }
        Self::answer(req.send().await.context("server unreachable")?).await
    }

    /// DELETE `path`.
    pub async fn delete(&self, path: &str) -> anyhow::Result<Value> {
        Self::answer(self.request(reqwest::Method::DELETE, path).send().await.context("server unreachable")?)
            .await
    }
}
