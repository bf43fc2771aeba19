//! An idempotent upstream that behaves as payment APIs do, on a real socket on 127.0.0.1.
//!
//! `POST /v1/{collection}` with an `Idempotency-Key` creates one object per key and returns
//! the original response on every repeat; a repeat with a different body is `422`. A missing
//! key or a malformed body is `400`. `GET /v1/{collection}` lists every object created, so a
//! test counts side effects where they happened, not by our own "done" flag.
//! [`post_idempotent`] sends the effect's `traceparent` when its run is traced.

use parking_lot::Mutex;
use std::{collections::HashMap, net::SocketAddr, sync::Arc};

use axum::{
    Json, Router,
    extract::{Path, State},
    http::{HeaderMap, StatusCode},
    routing::get,
};
use serde_json::{Value, json};

#[derive(Default)]
struct Objects {
    /// (collection, key) → (canonical request body, created object)
    by_key: HashMap<(String, String), (String, Value)>,
    created: Vec<(String, Value)>,
    requests: u64,
    required_auth: Option<String>,
    /// Collections whose answers wait this long after the object is created: a caller
    /// stays between its call and its answer meanwhile.
    held: HashMap<String, std::time::Duration>,
    /// (collection, idempotency key, `traceparent`) of every POST that carried one.
    traceparents: Vec<(String, String, String)>,
    /// (collection, idempotency key) of every POST with a key, repeats included.
    calls: Vec<(String, String)>,
}

type Shared = Arc<Mutex<Objects>>;

/// A running upstream. Dropping it stops the server.
pub struct Upstream {
    addr: SocketAddr,
    objects: Shared,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock(objects: &Shared) -> parking_lot::MutexGuard<'_, Objects> {
    objects.lock()
}

async fn create(
    State(objects): State<Shared>,
    Path(collection): Path<String>,
    headers: HeaderMap,
    body: String,
) -> (StatusCode, Json<Value>) {
    let (answer, held) = answer(&objects, &collection, &headers, &body);
    if let Some(wait) = held {
        tokio::time::sleep(wait).await;
    }
    answer
}

/// The answer to one POST, and how long to hold it (see [`Upstream::hold`]).
fn answer(
    objects: &Shared,
    collection: &str,
    headers: &HeaderMap,
    body: &str,
) -> ((StatusCode, Json<Value>), Option<std::time::Duration>) {
    let collection = collection.to_string();
    let mut o = lock(objects);
    o.requests += 1;
    if let Some(required) = &o.required_auth {
        let given = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("");
        if given != format!("Bearer {required}") {
            return ((StatusCode::UNAUTHORIZED, Json(json!({"error": "bad credentials"}))), None);
        }
    }
    let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).map(str::to_string) else {
        return ((StatusCode::BAD_REQUEST, Json(json!({"error": "Idempotency-Key header required"}))), None);
    };
    o.calls.push((collection.clone(), key.clone()));
    if let Some(parent) = headers.get("traceparent").and_then(|v| v.to_str().ok()) {
        o.traceparents.push((collection.clone(), key.clone(), parent.to_string()));
    }
    let Ok(parsed) = serde_json::from_str::<Value>(body) else {
        return ((StatusCode::BAD_REQUEST, Json(json!({"error": "body is not JSON"}))), None);
    };
    let canonical = parsed.to_string();
    if let Some((seen_body, object)) = o.by_key.get(&(collection.clone(), key.clone())) {
        if *seen_body != canonical {
            return (
                (
                    StatusCode::UNPROCESSABLE_ENTITY,
                    Json(json!({"error": "Idempotency-Key reused with a different body"})),
                ),
                None,
            );
        }
        return ((StatusCode::OK, Json(object.clone())), None);
    }
    let n = o.created.iter().filter(|(c, _)| *c == collection).count() + 1;
    let prefix: String = collection.chars().take(2).collect();
    let object = json!({"id": format!("{prefix}_{n}"), "object": collection, "idempotency_key": key, "request": parsed});
    o.by_key.insert((collection.clone(), key), (canonical, object.clone()));
    o.created.push((collection.clone(), object.clone()));
    let held = o.held.get(&collection).copied();
    ((StatusCode::OK, Json(object)), held)
}

async fn list(State(objects): State<Shared>, Path(collection): Path<String>) -> Json<Value> {
    let o = lock(&objects);
    let data: Vec<Value> =
        o.created.iter().filter(|(c, _)| *c == collection).map(|(_, v)| v.clone()).collect();
    Json(json!({ "data": data }))
}

impl Upstream {
    /// Starts on an ephemeral port of 127.0.0.1.
    pub async fn start() -> std::io::Result<Upstream> {
        Self::start_on("127.0.0.1:0".parse().map_err(std::io::Error::other)?, None).await
    }

    /// Starts on `addr`; with `required_auth`, POSTs must carry `Authorization: Bearer <it>`.
    pub async fn start_on(addr: SocketAddr, required_auth: Option<String>) -> std::io::Result<Upstream> {
        let objects: Shared = Arc::new(Mutex::new(Objects { required_auth, ..Objects::default() }));
        let app = Router::new().route("/v1/{collection}", get(list).post(create)).with_state(objects.clone());
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "upstream stopped");
            }
        });
        Ok(Upstream { addr, objects, task })
    }

    /// Holds every first answer of `collection` for `wait` after creating its object, so
    /// that a test can stop the caller between its call and the answer.
    pub fn hold(&self, collection: &str, wait: std::time::Duration) {
        lock(&self.objects).held.insert(collection.to_string(), wait);
    }

    /// Forgets every object (a checker resets it between cases).
    pub fn reset(&self) {
        let mut o = lock(&self.objects);
        o.by_key.clear();
        o.created.clear();
        o.calls.clear();
        o.traceparents.clear();
    }

    /// `(collection, idempotency key, traceparent)` of every POST that carried a
    /// `traceparent`, repeats included, in order.
    pub fn traceparents(&self) -> Vec<(String, String, String)> {
        lock(&self.objects).traceparents.clone()
    }

    /// `(collection, idempotency key)` of every POST that carried a key, repeats included,
    /// in order: a call made again with the same key shows here, not among the objects.
    pub fn calls(&self) -> Vec<(String, String)> {
        lock(&self.objects).calls.clone()
    }

    /// Every object created, with its collection, in order.
    pub fn all(&self) -> Vec<(String, Value)> {
        lock(&self.objects).created.clone()
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Objects created in `collection`, in creation order.
    pub fn objects(&self, collection: &str) -> Vec<Value> {
        lock(&self.objects).created.iter().filter(|(c, _)| c == collection).map(|(_, v)| v.clone()).collect()
    }

    /// POST requests received, repeats included.
    pub fn requests(&self) -> u64 {
        lock(&self.objects).requests
    }
}

/// Why a call of the upstream failed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// It did not answer, or its answer broke off.
    #[error("upstream unreachable: {0}")]
    Unreachable(#[source] reqwest::Error),
    /// It refused the call.
    #[error("upstream answered {status}: {text}")]
    Refused {
        /// Its status.
        status: reqwest::StatusCode,
        /// Its body.
        text: String,
    },
    /// Its answer is not the JSON it promises.
    #[error("upstream sent bad JSON: {0}")]
    BadJson(#[source] serde_json::Error),
}

/// POSTs `body` to `{base}/v1/{collection}` with an idempotency key; the created (or
/// original) object.
pub async fn post_idempotent(
    client: &reqwest::Client,
    base: &str,
    collection: &str,
    key: &str,
    auth: Option<&str>,
    body: &Value,
) -> Result<Value, UpstreamError> {
    let mut request = client
        .post(format!("{base}/v1/{collection}"))
        .header("Idempotency-Key", key)
        .header("Content-Type", "application/json")
        .body(body.to_string());
    if let Some(token) = auth {
        request = request.header("Authorization", format!("Bearer {token}"));
    }
    // Inside an effect whose run is traced: the call joins the effect's span.
    if let Some(parent) = durafiber_runtime::trace::traceparent() {
        request = request.header("traceparent", parent);
    }
    let response = request.send().await.map_err(UpstreamError::Unreachable)?;
    let status = response.status();
    let text = response.text().await.map_err(UpstreamError::Unreachable)?;
    if !status.is_success() {
        return Err(UpstreamError::Refused { status, text });
    }
    serde_json::from_str(&text).map_err(UpstreamError::BadJson)
}

/// Lists `{base}/v1/{collection}` over HTTP.
pub async fn list_remote(
    client: &reqwest::Client,
    base: &str,
    collection: &str,
) -> Result<Vec<Value>, UpstreamError> {
    let v: Value = client
        .get(format!("{base}/v1/{collection}"))
        .send()
        .await
        .map_err(UpstreamError::Unreachable)?
        .json()
        .await
        .map_err(UpstreamError::Unreachable)?;
    Ok(v["data"].as_array().cloned().unwrap_or_default())
}
