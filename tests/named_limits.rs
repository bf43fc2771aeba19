//! Named limits (`limits` in the config, `EffectOptions::limit`): a thousand runs through a
//! limit of five calls at once never have more than five calls at the fake model server; a
//! rate holds calls to it from the first call; a run waiting for its turn is live, shown in
//! inspection and counted in the gauges; a limit the config lacks and a bad limit are typed
//! errors.

use std::time::{Duration, Instant};

use durafiber_examples::openai::{self, Message, ModelConfig};
use durafiber_runtime::{
    Agent, AgentError, Ctx, EffectOptions, Recovered, RunStatus, Runtime, RuntimeConfig, RuntimeError,
};
use durafiber_store::{Store, StoreConfig};
use durafiber_testkit::openai::{FakeOpenAi, Reply};
use serde::{Deserialize, Serialize};

/// Asks the model once, its call waiting its turn in `limit`.
#[derive(Clone, Default)]
struct Asker;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Ask {
    base_url: String,
    limit: Option<String>,
}

impl Agent for Asker {
    const KIND: &'static str = "asker";
    type Input = Ask;
    type Stash = ();
    type Output = String;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, ask: Ask) -> Result<String, AgentError> {
        let options = EffectOptions { limit: ask.limit.clone(), attempts: 5, ..EffectOptions::default() };
        let http = openai::http_client();
        let turn = ctx
            .effect_stream("ask", ask, options, |key, ask, sink| {
                let http = http.clone();
                async move {
                    let model = ModelConfig {
                        base_url: ask.base_url,
                        model: "fake".into(),
                        key_secret: None,
                        limit: None,
                    };
                    let messages = [Message::text("user", "hello")];
                    openai::stream_turn(&http, &model, None, &key, &messages, &serde_json::json!([]), &sink)
                        .await
                }
            })
            .await?;
        Ok(turn.message.content.unwrap_or_default())
    }

    async fn on_fiber_recovered(
        &self,
        ctx: &mut Ctx<Self>,
        r: Recovered<Self>,
    ) -> Result<String, AgentError> {
        self.run_fiber(ctx, r.input).await
    }
}

async fn runtime(dir: &std::path::Path, limits: &str) -> Runtime {
    let store = Store::open_dir(dir, StoreConfig::default()).expect("store");
    let config = RuntimeConfig::from_json(&format!(r#"{{"limits": {limits}}}"#)).expect("config");
    Runtime::builder(store).config(config).agent(Asker).open().await.expect("runtime")
}

fn ask(model: &FakeOpenAi, limit: &str) -> Ask {
    Ask { base_url: model.base_url(), limit: Some(limit.into()) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_runs_through_a_limit_of_five_never_have_more_than_five_calls_at_the_model() {
    let model = FakeOpenAi::start().await.expect("model");
    model.default_answer(Reply::text(&["a ", "b ", "c ", "d"]));
    model.chunk_delay(Duration::from_millis(1));
    model.gather(5); // the first five calls meet: the limit is seen reached
    let dir = tempfile::tempdir().expect("dir");
    let rt = runtime(dir.path(), r#"{"model": {"concurrency": 5}}"#).await;
    let mut runs = Vec::new();
    for n in 0..1_000 {
        runs.push(rt.start::<Asker>(&format!("ask-{n}"), &ask(&model, "model")).await.expect("start").run_id);
    }
    for run_id in &runs {
        let status = tokio::time::timeout(Duration::from_secs(120), rt.wait(run_id)).await.expect("in time");
        assert!(matches!(&status, Ok(RunStatus::Completed { .. })), "{run_id}: {status:?}");
    }
    assert_eq!(model.recorded().len(), 1_000, "one call a run");
    assert!(model.most_in_flight() <= 5, "{} calls at once", model.most_in_flight());
    assert_eq!(model.most_in_flight(), 5, "the limit was reached, not merely respected");
    assert!(rt.check_liveness().expect("liveness").is_empty());
    let gauges = rt.gauges().expect("gauges");
    assert_eq!(gauges.limits["model"], durafiber_runtime::LimitGauge { waiting: 0, in_flight: 0 });
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_waiting_for_its_turn_is_shown_waiting_on_its_limit() {
    let model = FakeOpenAi::start().await.expect("model");
    model.default_answer(Reply::text(&["a ", "b ", "c"]));
    model.hold_at(1); // the first call holds the only slot until released
    let dir = tempfile::tempdir().expect("dir");
    let rt = runtime(dir.path(), r#"{"model": {"concurrency": 1}}"#).await;
    let first = rt.start::<Asker>("first", &ask(&model, "model")).await.expect("start").run_id;
    let deadline = Instant::now() + Duration::from_secs(60);
    while model.recorded().is_empty() {
        assert!(Instant::now() < deadline, "the first call never came");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let second = rt.start::<Asker>("second", &ask(&model, "model")).await.expect("start").run_id;
    while rt.inspect(&second).expect("inspect").waiting_on_limit.is_none() {
        assert!(Instant::now() < deadline, "the second run never waited on the limit");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(rt.inspect(&second).expect("inspect").waiting_on_limit.as_deref(), Some("model"));
    assert_eq!(rt.inspect(&first).expect("inspect").waiting_on_limit, None, "the first has its turn");
    let gauges = rt.gauges().expect("gauges");
    assert_eq!(gauges.limits["model"], durafiber_runtime::LimitGauge { waiting: 1, in_flight: 1 });
    assert!(rt.check_liveness().expect("liveness").is_empty(), "a run waiting on a limit is live");
    assert_eq!(model.recorded().len(), 1, "the second call waits");
    model.release();
    for run_id in [&first, &second] {
        let status = tokio::time::timeout(Duration::from_secs(60), rt.wait(run_id)).await.expect("in time");
        assert!(matches!(&status, Ok(RunStatus::Completed { .. })), "{status:?}");
    }
    assert_eq!(model.most_in_flight(), 1);
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_holds_calls_from_the_first_one() {
    let model = FakeOpenAi::start().await.expect("model");
    model.default_answer(Reply::text(&["ok"]));
    let dir = tempfile::tempdir().expect("dir");
    let rt = runtime(dir.path(), r#"{"model": {"rate": "20/s"}}"#).await;
    let began = Instant::now();
    let mut runs = Vec::new();
    for n in 0..30 {
        runs.push(rt.start::<Asker>(&format!("ask-{n}"), &ask(&model, "model")).await.expect("start").run_id);
    }
    for run_id in &runs {
        let status = tokio::time::timeout(Duration::from_secs(60), rt.wait(run_id)).await.expect("in time");
        assert!(matches!(&status, Ok(RunStatus::Completed { .. })), "{status:?}");
    }
    // The bucket starts empty and fills at 20 a second: 30 calls take 1.5 s at least.
    assert!(began.elapsed() >= Duration::from_millis(1_450), "30 calls in {:?}", began.elapsed());
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_the_config_lacks_fails_the_run_and_a_bad_limit_is_a_config_error() {
    let model = FakeOpenAi::start().await.expect("model");
    let dir = tempfile::tempdir().expect("dir");
    let rt = runtime(dir.path(), r#"{"model": {"concurrency": 2}}"#).await;
    let run_id = rt.start::<Asker>("typo", &ask(&model, "modle")).await.expect("start").run_id;
    let status = tokio::time::timeout(Duration::from_secs(60), rt.wait(&run_id)).await.expect("in time");
    assert!(
        matches!(&status, Ok(RunStatus::Failed { error }) if error.contains("modle") && error.contains("limits")),
        "{status:?}"
    );
    assert!(model.recorded().is_empty(), "nothing was called");
    rt.shutdown().await;

    for (bad, says) in [
        (r#"{"m": {"concurrency": 0}}"#, "concurrency must be at least 1"),
        (r#"{"m": {}}"#, "give it a concurrency, a rate or both"),
        (r#"{"m": {"rate": "ten/min"}}"#, "no number of calls"),
        (r#"{"m": {"rate": "10/fortnight"}}"#, "unknown period"),
        (r#"{"m": {"rate": "0/s"}}"#, "above zero"),
        (r#"{"m": {"burst": 3}}"#, "unknown field"),
    ] {
        let parsed = RuntimeConfig::from_json(&format!(r#"{{"limits": {bad}}}"#))
            .and_then(|c| c.validate().map(|()| c));
        assert!(matches!(&parsed, Err(RuntimeError::Config(e)) if e.contains(says)), "{bad}: {parsed:?}");
    }
}
