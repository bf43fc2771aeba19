//! The model agent behind a named limit of five calls at once (`limits` in the `--config`
//! file, `DURAFIBER_MODEL_LIMIT`): a thousand runs never have more than five calls at the fake
//! model server — through SIGKILLs of the server at random times on the embedded store, and
//! on two PostgreSQL nodes with one of them killed — and every run completes, none escalated,
//! with every open run accounted for.

mod common;

use std::{path::Path, process::Child, time::Duration};

use common::{free_port, rand_seed, serve};
use durafiber::client::{Client, StartOptions, Status};
use durafiber::rng::SeededRng;
use durafiber::testkit::{
    openai::{FakeOpenAi, Reply},
    postgres::PgServer,
    upstream::Upstream,
};
use durafiber_examples::model_agent::{ModelAgent, Task};
use durafiber_examples::openai::ModelConfig;

const RUNS: usize = 1_000;

fn task(n: usize) -> Task {
    Task { prompt: format!("question {n}"), max_turns: 3 }
}

/// A fake model whose every answer streams four chunks, `pace` apart.
async fn model(pace: Duration) -> FakeOpenAi {
    let model = FakeOpenAi::start().await.expect("model");
    model.default_answer(Reply::text(&["an ", "answer ", "in ", "four"]));
    model.chunk_delay(pace);
    model.gather(5); // the first five calls meet: the limit is seen reached
    model
}

/// The config file: the limit `model`, five calls at once.
fn config(dir: &Path) -> String {
    let path = dir.join("limits.json");
    std::fs::write(&path, r#"{"limits": {"model": {"concurrency": 5}}}"#).expect("config file");
    path.display().to_string()
}

const LIMIT_ENV: [(&str, &str); 1] = [("DURAFIBER_MODEL_LIMIT", "model")];

fn client(port: u16, data: &Path) -> Client {
    let token = std::fs::read_to_string(data.join("admin.token")).expect("admin token");
    Client::new(&format!("http://127.0.0.1:{port}"))
        .expect("client")
        .with_token(Some(token.trim().to_string()))
        .with_retry_budget(Duration::from_secs(60))
}

fn kill(mut server: Child) {
    server.kill().expect("SIGKILL");
    server.wait().expect("reaped");
}

/// Waits for every run; each must complete.
async fn all_complete(client: &Client, runs: &[durafiber::RunId]) {
    for run_id in runs {
        let status = client.wait(run_id, Duration::from_secs(180)).await.expect("wait");
        assert!(matches!(status, Status::Completed { .. }), "{run_id}: {status:?}");
    }
}

/// Opens the store the servers left and checks that no open run is left behind.
async fn liveness_clean(store: durafiber::Store, model: &FakeOpenAi, tools: &Upstream) {
    let config =
        ModelConfig { base_url: model.base_url(), model: "fake".into(), key_secret: None, limit: None };
    let runtime = durafiber::Runtime::builder(store)
        .agent(ModelAgent::new(config, &tools.url()))
        .open()
        .await
        .expect("runtime");
    assert!(runtime.check_liveness().expect("liveness").is_empty());
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_runs_through_a_limit_of_five_killed_at_random_never_have_six_calls_at_the_model() {
    let seed = std::env::var("DURAFIBER_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand_seed);
    eprintln!("seed {seed} (DURAFIBER_SEED={seed} to repeat)");
    let mut rng = SeededRng::new(seed);
    let (model, tools) = (model(Duration::from_millis(1)).await, Upstream::start().await.expect("tools"));
    let data = tempfile::tempdir().expect("data");
    let config = config(data.path());
    let args = ["--config", config.as_str()];
    let port = free_port();
    let mut server = serve(data.path(), port, &model, &tools, &args, &LIMIT_ENV);
    let client = client(port, data.path());
    let mut runs = Vec::with_capacity(RUNS);
    for n in 0..RUNS {
        let started =
            client.start("model-agent", &format!("q-{n}"), &task(n), &StartOptions::default()).await;
        runs.push(started.expect("start").run_id);
    }
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(rng.between(50, 800))).await;
        kill(server);
        server = serve(data.path(), port, &model, &tools, &args, &LIMIT_ENV);
    }
    all_complete(&client, &runs).await;
    kill(server);

    assert!(model.most_in_flight() <= 5, "{} calls at once", model.most_in_flight());
    assert_eq!(model.most_in_flight(), 5, "the limit was reached, not merely respected");
    let mut keys: Vec<_> = model.recorded().into_iter().filter_map(|r| r.idempotency_key).collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), RUNS, "one model turn a run");
    let store = durafiber::Store::open_dir(data.path(), durafiber::StoreConfig::default()).expect("store");
    liveness_clean(store, &model, &tools).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_runs_on_two_postgres_nodes_share_one_limit_of_five_through_a_node_kill() {
    let pg = PgServer::start().expect("PostgreSQL");
    let url = pg.fresh_database().expect("database");
    // Calls long enough that both nodes have more waiting than five slots hold.
    let (model, tools) = (model(Duration::from_millis(10)).await, Upstream::start().await.expect("tools"));
    let data = tempfile::tempdir().expect("data");
    let config = config(data.path());
    let node = |id: &'static str, port: u16| {
        let args =
            ["--config", config.as_str(), "--store", url.as_str(), "--node-id", id, "--lease-ttl", "2s"];
        serve(data.path(), port, &model, &tools, &args, &LIMIT_ENV)
    };
    let (port_a, port_b) = (free_port(), free_port());
    let a = node("a", port_a);
    let mut b = node("b", port_b);
    let (client_a, client_b) = (client(port_a, data.path()), client(port_b, data.path()));
    let mut runs = Vec::with_capacity(RUNS);
    for n in 0..RUNS {
        let on = if n % 2 == 0 { &client_a } else { &client_b };
        let started = on.start("model-agent", &format!("q-{n}"), &task(n), &StartOptions::default()).await;
        runs.push(started.expect("start").run_id);
        if n == RUNS / 2 {
            // Node b dies with calls in flight; its runs and its slots move on.
            kill(b);
            b = node("b", port_b);
        }
    }
    all_complete(&client_a, &runs).await;
    kill(a);
    kill(b);

    assert!(model.most_in_flight() <= 5, "{} calls at once on two nodes", model.most_in_flight());
    assert_eq!(model.most_in_flight(), 5, "the limit was reached, not merely respected");
    let mut keys: Vec<_> = model.recorded().into_iter().filter_map(|r| r.idempotency_key).collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), RUNS, "one model turn a run");
    let store = durafiber::Store::open_postgres(&url, durafiber::StoreConfig::default()).expect("store");
    liveness_clean(store, &model, &tools).await;
}
