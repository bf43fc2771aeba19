//! A run's one trace across a SIGKILL: `durafiber serve` exports to a collector in the
//! test's process; a refund started with the caller's `traceparent` waits for its reviewer
//! when the server is SIGKILLed; a second server takes the decision (a comment with the
//! upstream's key pasted into it; the decider named in its span) and finishes the run. The
//! trace holds both processes' spans under one root, every parent present, each effect
//! executed once with its span's `traceparent` at the upstream, and not one byte of the key.

use std::{ffi::OsStr, time::Duration};

use durafiber_testkit::{
    otlp::{self, Receiver},
    upstream::Upstream,
};
use serde_json::json;

mod common;
use common::Served;

const KEY: &str = "sk_test_traced_secret_90211";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_keeps_one_trace_across_a_sigkilled_server() {
    let receiver = Receiver::start().await.expect("receiver");
    let upstream =
        Upstream::start_on("127.0.0.1:0".parse().expect("addr"), Some(KEY.into())).await.expect("upstream");
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let config = dir.path().join("config.json");
    let traces = json!({"traces": {
        "endpoint": receiver.endpoint(),
        "export_every": "100ms",
        "ui": "http://traces.example/trace/{trace_id}",
    }});
    std::fs::write(&config, traces.to_string()).expect("config");
    let hosts = upstream.url().trim_start_matches("http://").to_string();
    let env =
        [("DURAFIBER_SECRET_UPSTREAM_KEY", KEY), ("DURAFIBER_SECRET_UPSTREAM_KEY_HOSTS", hosts.as_str())];
    let args: [&OsStr; 2] = ["--config".as_ref(), config.as_os_str()];
    let mut first = Served::start_env(&data, &args, &env);

    let caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let input = json!({"order_id": "o-1", "amount_cents": 2500, "customer_email": "a@b.c",
        "upstream": upstream.url(), "api_key": {"secret": "upstream_key"}});
    let run_id = first.start_run("refund", "refund-o-1", input, &[("traceparent", caller)]).await;
    let trace_id = durafiber_runtime::trace::trace_id_of(&run_id.as_str().into());
    let view = first
        .wait_run(&run_id, "waiting for approval", |v| v["run"]["status"].get("waiting_approval").is_some())
        .await;
    assert_eq!(view["trace_id"], json!(trace_id));
    assert_eq!(view["trace_url"], json!(format!("http://traces.example/trace/{trace_id}")));

    // The first server's spans are out before it dies mid-run.
    let sent = receiver
        .wait_for(Duration::from_secs(30), |spans| {
            spans.iter().any(|s| s.trace_id == trace_id && s.name == "approval.request")
        })
        .await;
    assert!(sent, "the first server sent no approval span: {:?}", receiver.spans());
    first.sigkill();

    let second = Served::start_env(&data, &args, &env);
    let view = second.run_view(&run_id).await;
    let hash = view["approvals"][0]["payload_hash"].as_str().expect("payload hash").to_string();
    let decision = json!({"payload_hash": hash, "approved": true, "comment": format!("ok, key {KEY}")});
    let decided = second
        .client()
        .post(second.url(&format!("/runs/{run_id}/approvals/refund")))
        .body(decision.to_string())
        .send()
        .await
        .expect("approve");
    assert!(decided.status().is_success(), "{}", decided.text().await.unwrap_or_default());
    second.wait_run(&run_id, "completed", |v| v["run"]["status"].get("completed").is_some()).await;
    // The settlement and the last attempt's span are sent one after the other, maybe in two
    // exports: wait for both.
    let settled = receiver
        .wait_for(Duration::from_secs(30), |spans| {
            let of_run = |name: &str, outcome: Option<&str>| {
                spans.iter().any(|s| {
                    s.trace_id == trace_id
                        && s.name == name
                        && outcome.is_none_or(|o| s.attr("durafiber.outcome") == Some(o))
                })
            };
            of_run("run.settle", None) && of_run("fiber.attempt", Some("completed"))
        })
        .await;
    assert!(settled, "the second server sent no settlement or last attempt");

    let spans = receiver.trace(&trace_id);
    let problems = otlp::problems(&trace_id, &spans);
    assert!(problems.is_empty(), "{problems:#?}\n{spans:#?}");
    let pids: std::collections::BTreeSet<&str> =
        spans.iter().filter_map(|s| s.resource.get("process.pid").map(String::as_str)).collect();
    assert_eq!(pids.len(), 2, "spans from both processes: {pids:?}");
    let root = spans.iter().find(|s| s.name == "run").expect("root");
    assert_eq!(root.links, vec![("4bf92f3577b34da6a3ce929d0e0e4736".into(), "00f067aa0ba902b7".into())]);
    // The attempt the first server died in was sent by the second, and its spans kept it.
    let first_pid = root.resource.get("process.pid").expect("pid");
    let lost = spans
        .iter()
        .find(|s| s.name == "fiber.attempt" && s.attr("durafiber.attempt") == Some("1"))
        .expect("attempt 1's span");
    assert_ne!(lost.resource.get("process.pid"), Some(first_pid), "{lost:?}");
    assert_eq!(lost.attr("durafiber.outcome"), Some("left memory"));
    let decision = spans.iter().find(|s| s.name == "approval.decision").expect("decision span");
    assert!(
        !decision.attr("durafiber.approval.by").unwrap_or_default().is_empty(),
        "who decided: {decision:?}"
    );
    for name in
        ["stash", "approval.request", "approval.decision", "effect refund", "effect email:confirmation"]
    {
        assert!(spans.iter().any(|s| s.name == name), "no {name} span");
    }
    let heard = upstream.traceparents();
    assert_eq!(heard.len(), 2, "{heard:?}");
    for (_, _, parent) in &heard {
        let span_id = parent.split('-').nth(2).expect("span id");
        let effect = spans.iter().find(|s| s.span_id == span_id).expect("the call's effect span");
        assert_eq!(effect.attr("durafiber.effect.outcome"), Some("executed"), "{effect:?}");
        assert_ne!(effect.resource.get("process.pid"), Some(first_pid));
    }
    let raw = receiver.raw();
    assert!(!raw.windows(KEY.len()).any(|w| w == KEY.as_bytes()), "the key left in a span");
}
