//! `GET /openapi.json` describes the API as it answers: every request here goes to a real
//! `durafiber serve`, and each answer must be documented (its route, its method, its status
//! or status range) and match the documented schema (JSON Schema 2020-12, as OpenAPI 3.1
//! says). Every documented operation must be exercised at least once, so an entry cannot go
//! stale unnoticed, and a route the document lacks fails the first request to it.

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use durafiber_testkit::upstream::Upstream;
use reqwest::{Method, RequestBuilder};
use serde_json::{Value, json};

mod common;
use common::Served;

/// The document and the operations answered so far.
struct Checker {
    doc: Value,
    answered: BTreeSet<(String, String)>,
}

impl Checker {
    /// Sends `request` for the operation `method path` (path as the document writes it)
    /// and checks the answer against the document; returns its JSON body (or text).
    async fn call(&mut self, method: Method, path: &str, request: RequestBuilder) -> (u16, Value) {
        let answer = request.send().await.expect("an answer");
        let status = answer.status().as_u16();
        let content_type = answer
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .unwrap_or("")
            .to_string();
        let bytes = answer.bytes().await.expect("body");
        let op_key = method.as_str().to_ascii_lowercase();
        let operation = &self.doc["paths"][path][&op_key];
        assert!(operation.is_object(), "{method} {path} answered {status} but is not in /openapi.json");
        let responses = &operation["responses"];
        let range = format!("{}XX", status / 100);
        let response = [status.to_string(), range, "default".into()]
            .into_iter()
            .map(|k| &responses[&k])
            .find(|r| r.is_object())
            .unwrap_or_else(|| panic!("{method} {path} answered {status}, which its entry does not list"));
        let schema = &response["content"][&content_type]["schema"];
        assert!(
            schema.is_object(),
            "{method} {path} answered {status} as {content_type:?}, not a documented content type: {response}"
        );
        let body = if content_type == "application/json" {
            serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e})"))
        } else {
            Value::String(String::from_utf8_lossy(&bytes).into_owned())
        };
        if content_type == "application/json" {
            self.validate(schema, &body)
                .unwrap_or_else(|e| panic!("{method} {path} {status}: {e}\nbody: {body}"));
        }
        self.answered.insert((op_key, path.to_string()));
        (status, body)
    }

    /// `instance` against `schema`, whose `$ref`s point into the document's components.
    fn validate(&self, schema: &Value, instance: &Value) -> Result<(), String> {
        let mut root = schema.clone();
        let Some(fields) = root.as_object_mut() else {
            return Err(format!("schema is not an object: {schema}"));
        };
        fields.insert("$schema".into(), json!("https://json-schema.org/draft/2020-12/schema"));
        fields.insert("components".into(), self.doc["components"].clone());
        let validator =
            jsonschema::validator_for(&root).map_err(|e| format!("the schema does not compile: {e}"))?;
        let errors: Vec<String> =
            validator.iter_errors(instance).map(|e| format!("{} at {}", e, e.instance_path())).collect();
        if errors.is_empty() { Ok(()) } else { Err(errors.join("; ")) }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_is_documented_and_every_answer_matches_its_schema() {
    let upstream = Upstream::start().await.expect("upstream");
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Served::start(dir.path());
    let http = server.client();
    let plain = reqwest::Client::new();
    let doc: Value =
        plain.get(server.url("/openapi.json")).send().await.expect("doc").json().await.expect("json");
    assert_eq!(doc["openapi"], json!("3.1.0"));
    assert!(doc["components"]["securitySchemes"]["bearer"]["scheme"] == json!("bearer"), "the auth scheme");
    let mut c = Checker { doc, answered: BTreeSet::new() };
    // The check can fail: a wrong body against a real schema is caught.
    let wrong = c.validate(&json!({"$ref": "#/components/schemas/StartOutcome"}), &json!({"run_id": 5}));
    assert!(wrong.is_err(), "the schema check accepts anything");
    let url = |p: &str| server.url(p);

    c.call(Method::GET, "/openapi.json", plain.get(url("/openapi.json"))).await;
    let (s, _) = c.call(Method::GET, "/health", plain.get(url("/health"))).await;
    assert_eq!(s, 200);
    let (s, _) = c.call(Method::GET, "/runs", plain.get(url("/runs"))).await;
    assert_eq!(s, 401, "no token");

    // A refund: start (201, then 200 for the same key), a bad start, list, approve, inspect.
    let refund = json!({"kind": "refund", "input": {"order_id": "o-1", "amount_cents": 700,
        "customer_email": "c@example.com", "upstream": upstream.url()}});
    let start = |key: &str, body: &Value| {
        http.post(url("/runs")).header("Idempotency-Key", key).body(body.to_string())
    };
    let (s, started) = c.call(Method::POST, "/runs", start("r-1", &refund)).await;
    assert_eq!(s, 201);
    let (s, _) = c.call(Method::POST, "/runs", start("r-1", &refund)).await;
    assert_eq!(s, 200);
    let (s, _) = c.call(Method::POST, "/runs", start("r-2", &json!({"kind": "nope", "input": 1}))).await;
    assert_eq!(s, 400);
    let run_id = started["run_id"].as_str().expect("run id").to_string();
    let run = format!("/runs/{run_id}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let hash = loop {
        let (_, pending) = c.call(Method::GET, "/approvals", http.get(url("/approvals"))).await;
        if let Some(p) = pending.as_array().into_iter().flatten().find(|p| p["run_id"] == json!(run_id)) {
            break p["payload_hash"].clone();
        }
        assert!(Instant::now() < deadline, "no approval");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    c.call(Method::GET, "/runs/{id}", http.get(url(&run))).await;
    c.call(Method::GET, "/runs", http.get(url("/runs?limit=1"))).await;
    let (s, _) = c.call(Method::GET, "/runs", http.get(url("/runs?state=bogus"))).await;
    assert_eq!(s, 400);
    let decide = |hash: &Value| json!({"payload_hash": hash, "approved": true, "comment": "ok"}).to_string();
    let approve = format!("{run}/approvals/refund");
    let (s, _) = c
        .call(
            Method::POST,
            "/runs/{id}/approvals/{approval_id}",
            http.post(url(&approve)).body(decide(&json!("x"))),
        )
        .await;
    assert_eq!(s, 409, "a stale hash");
    let (s, _) = c
        .call(
            Method::POST,
            "/runs/{id}/approvals/{approval_id}",
            http.post(url(&approve)).body(decide(&hash)),
        )
        .await;
    assert_eq!(s, 200);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, view) = c.call(Method::GET, "/runs/{id}", http.get(url(&run))).await;
        if view["run"]["status"]["completed"].is_object() {
            assert!(view["ledger"][0]["committed"]["receipt"].is_object(), "{view}");
            break;
        }
        assert!(Instant::now() < deadline, "the refund never completed: {view}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Its history, and a fork from its last boundary (201, then 200 for the same key; a
    // boundary the history does not keep is refused).
    let (s, history) =
        c.call(Method::GET, "/runs/{id}/history", http.get(url(&format!("{run}/history")))).await;
    assert_eq!(s, 200);
    let last = history.as_array().and_then(|h| h.last()).expect("a boundary")["seq"].clone();
    let fork = |key: &str, at: &Value| {
        http.post(url(&format!("{run}/fork")))
            .header("Idempotency-Key", key)
            .body(json!({"at": at}).to_string())
    };
    let (s, _) = c.call(Method::POST, "/runs/{id}/fork", fork("f-1", &last)).await;
    assert_eq!(s, 201);
    let (s, _) = c.call(Method::POST, "/runs/{id}/fork", fork("f-1", &last)).await;
    assert_eq!(s, 200);
    let (s, refused) = c.call(Method::POST, "/runs/{id}/fork", fork("f-2", &json!(99))).await;
    assert_eq!((s, refused["kind"].clone()), (409, json!("ForkRefused")));
    let (s, _) = c.call(Method::GET, "/runs/{id}", http.get(url("/runs/run_nope"))).await;
    assert_eq!(s, 404);

    // An order: alarms, a request, an event, storage.
    let order = json!({"kind": "order", "input": {"order_id": "o-2", "amount_cents": 9, "upstream": upstream.url(),
        "alarm_delays_ms": [600_000], "wait_for_packing": true}});
    let (_, started) = c.call(Method::POST, "/runs", start("o-2", &order)).await;
    let order_run = format!("/runs/{}", started["run_id"].as_str().expect("id"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.call(Method::GET, "/runs/{id}/alarms", http.get(url(&format!("{order_run}/alarms")))).await.1
        == json!([])
    {
        assert!(Instant::now() < deadline, "the order set no alarm");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let alarm = format!("{order_run}/alarms/extra");
    let set = json!({"delay_ms": 600_000, "payload": {"n": 1}}).to_string();
    let (s, _) = c.call(Method::PUT, "/runs/{id}/alarms/{name}", http.put(url(&alarm)).body(set)).await;
    assert_eq!(s, 200);
    let cron =
        json!({"cron": "0 9 * * MON-FRI", "time_zone": "Europe/Berlin", "payload": "standup"}).to_string();
    let (s, _) = c.call(Method::PUT, "/runs/{id}/alarms/{name}", http.put(url(&alarm)).body(cron)).await;
    assert_eq!(s, 200);
    let (_, listed) =
        c.call(Method::GET, "/runs/{id}/alarms", http.get(url(&format!("{order_run}/alarms")))).await;
    let extra =
        listed.as_array().and_then(|a| a.iter().find(|a| a["name"] == "extra")).cloned().unwrap_or_default();
    assert_eq!(extra["cron"]["expr"], "0 9 * * MON-FRI", "{listed}");
    let (s, _) = c.call(Method::PUT, "/runs/{id}/alarms/{name}", http.put(url(&alarm)).body("{}")).await;
    assert_eq!(s, 400, "neither delay nor time");
    c.call(Method::DELETE, "/runs/{id}/alarms/{name}", http.delete(url(&alarm))).await;
    let (s, _) = c
        .call(
            Method::POST,
            "/runs/{id}/requests",
            http.post(url(&format!("{order_run}/requests"))).body("null"),
        )
        .await;
    assert_eq!(s, 200);
    let packed = json!({"payload": {"box": 1}, "idempotency_key": "p"}).to_string();
    let events = format!("{order_run}/events/packed");
    let (s, _) = c.call(Method::POST, "/runs/{id}/events/{name}", http.post(url(&events)).body(packed)).await;
    assert_eq!(s, 200);
    let (s, _) = c
        .call(Method::GET, "/runs/{id}/storage", http.get(url(&format!("{order_run}/storage?limit=5"))))
        .await;
    assert_eq!(s, 200);

    // A steps run: a message (the hosted agents take none: 409, the agent's refusal), then cancel.
    let steps = json!({"kind": "steps", "input": {"steps": 1000, "pause_ms": 1000}});
    let (_, started) = c.call(Method::POST, "/runs", start("s-1", &steps)).await;
    let steps_run = format!("/runs/{}", started["run_id"].as_str().expect("id"));
    let (s, _) = c
        .call(
            Method::POST,
            "/runs/{id}/messages",
            http.post(url(&format!("{steps_run}/messages"))).body("null"),
        )
        .await;
    assert_eq!(s, 409);
    let cancel = http.post(url(&format!("{steps_run}/cancel"))).body(json!({"reason": "enough"}).to_string());
    let (s, _) = c.call(Method::POST, "/runs/{id}/cancel", cancel).await;
    assert_eq!(s, 200);
    // A writer's output stream, once it has ended: as JSON, and as events that end at once.
    let writer = json!({"kind": "writer", "input": {"chunks": 3, "per_stash": 2, "pause_ms": 0}});
    let (_, started) = c.call(Method::POST, "/runs", start("w-1", &writer)).await;
    let writer_run = format!("/runs/{}", started["run_id"].as_str().expect("id"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while http.get(url(&writer_run)).send().await.expect("run").json::<Value>().await.expect("json")["run"]["status"]
        .get("completed")
        .is_none()
    {
        assert!(Instant::now() < deadline, "the writer did not finish");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stream = url(&format!("{writer_run}/stream"));
    let (s, chunks) = c.call(Method::GET, "/runs/{id}/stream", http.get(&stream)).await;
    assert_eq!((s, chunks.as_array().map(Vec::len)), (200, Some(3)), "{chunks}");
    let sse = http.get(&stream).header("Accept", "text/event-stream").header("Last-Event-ID", "0");
    let (s, events) = c.call(Method::GET, "/runs/{id}/stream", sse).await;
    let text = events.as_str().unwrap_or_default();
    assert!(s == 200 && text.matches("event: chunk").count() == 2 && text.contains("event: end"), "{events}");
    // The kill switch: a kind, then one run.
    let why = json!({"reason": "INC-7"}).to_string();
    let (s, _) = c
        .call(Method::POST, "/kinds/{kind}/pause", http.post(url("/kinds/writer/pause")).body(why.clone()))
        .await;
    assert_eq!(s, 200);
    let (s, _) = c
        .call(Method::POST, "/kinds/{kind}/pause", http.post(url("/kinds/nobody/pause")).body(why.clone()))
        .await;
    assert!((400..500).contains(&s), "an unknown kind is refused");
    let (_, held) = c.call(Method::GET, "/paused", http.get(url("/paused"))).await;
    assert_eq!(held["kinds"][0]["target"], "writer", "{held}");
    let (_, resumed) =
        c.call(Method::POST, "/kinds/{kind}/resume", http.post(url("/kinds/writer/resume"))).await;
    assert_eq!(resumed["changed"], true, "{resumed}");
    let (s, _) = c
        .call(Method::POST, "/runs/{id}/pause", http.post(url(&format!("{order_run}/pause"))).body(why))
        .await;
    assert_eq!(s, 200);
    let (_, resumed) =
        c.call(Method::POST, "/runs/{id}/resume", http.post(url(&format!("{order_run}/resume")))).await;
    assert_eq!(resumed["changed"], true, "{resumed}");
    let (s, _) = c.call(Method::GET, "/runs/{id}/stream", http.get(url("/runs/run_nope/stream"))).await;
    assert_eq!(s, 404);

    // Operations and admin.
    c.call(Method::GET, "/metrics", http.get(url("/metrics"))).await;
    c.call(Method::GET, "/metrics.json", http.get(url("/metrics.json"))).await;
    let (_, log) =
        c.call(Method::GET, "/events", http.get(url(&format!("/events?run_id={run_id}&after=0")))).await;
    assert!(log.as_array().is_some_and(|l| !l.is_empty()));
    c.call(Method::GET, "/backup", http.get(url("/backup"))).await;
    let token = json!({"name": "ci", "role": "reader"}).to_string();
    let (s, _) = c.call(Method::POST, "/tokens", http.post(url("/tokens")).body(token.clone())).await;
    assert_eq!(s, 201);
    let (s, _) = c.call(Method::POST, "/tokens", http.post(url("/tokens")).body(token)).await;
    assert_eq!(s, 409, "the name is taken");
    c.call(Method::GET, "/tokens", http.get(url("/tokens"))).await;
    c.call(Method::DELETE, "/tokens/{name}", http.delete(url("/tokens/ci"))).await;
    c.call(Method::GET, "/audit", http.get(url("/audit?limit=3"))).await;
    // Deleting: the open order is refused, the completed refund goes.
    let (s, _) = c.call(Method::DELETE, "/runs/{id}", http.delete(url(&order_run))).await;
    assert_eq!(s, 409, "an open run is kept");
    let (s, _) = c.call(Method::DELETE, "/runs/{id}", http.delete(url(&run))).await;
    assert_eq!(s, 200, "a completed run is deleted");

    // Every documented operation was answered.
    let documented: BTreeSet<(String, String)> = c.doc["paths"]
        .as_object()
        .expect("paths")
        .iter()
        .flat_map(|(path, item)| {
            item.as_object().into_iter().flatten().map(move |(m, _)| (m.clone(), path.clone()))
        })
        .filter(|(m, _)| ["get", "post", "put", "delete", "patch"].contains(&m.as_str()))
        .collect();
    let missed: Vec<_> = documented.difference(&c.answered).collect();
    assert!(missed.is_empty(), "documented but never exercised here: {missed:?}");
}

/// The guide's table of endpoints (`docs/guide/operations.md`, "Every endpoint") is the
/// server's: the same operations as `GET /openapi.json`, none missing, none extra.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guides_endpoint_table_lists_exactly_the_documents_operations() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Served::start(dir.path());
    let doc: Value =
        reqwest::get(server.url("/openapi.json")).await.expect("doc").json().await.expect("json");
    let mut served = BTreeSet::new();
    for (path, operations) in doc["paths"].as_object().expect("paths") {
        for method in operations.as_object().expect("operations").keys() {
            if ["get", "post", "put", "delete", "patch"].contains(&method.as_str()) {
                served.insert((method.to_ascii_uppercase(), path.clone()));
            }
        }
    }
    let guide =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/guide/operations.md"))
            .expect("the operations guide");
    let table =
        guide.split("### Every endpoint").nth(1).expect("the section").split("\n### ").next().unwrap_or("");
    let listed = operations_in(table.lines());
    let missing: Vec<_> = served.difference(&listed).collect();
    let extra: Vec<_> = listed.difference(&served).collect();
    assert!(missing.is_empty() && extra.is_empty(), "not in the guide: {missing:?}; not served: {extra:?}");
    // The server crate's own map of its routes, in its crate documentation, is the same.
    let crate_doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../server/src/lib.rs"))
        .expect("lib.rs");
    let mapped = operations_in(crate_doc.lines().filter_map(|l| l.strip_prefix("//!")));
    let missing: Vec<_> = served.difference(&mapped).collect();
    let extra: Vec<_> = mapped.difference(&served).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "not in durafiber-server's route table: {missing:?}; not served: {extra:?}"
    );
}

/// The (method, path) rows of a Markdown table whose first two cells are a method and a
/// path in backticks.
fn operations_in<'a>(lines: impl Iterator<Item = &'a str>) -> BTreeSet<(String, String)> {
    lines
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let method = *cells.get(1)?;
            let path = cells.get(2)?.trim_matches('`');
            ["GET", "POST", "PUT", "DELETE", "PATCH"]
                .contains(&method)
                .then(|| (method.to_string(), path.to_string()))
        })
        .collect()
}
