//! The public checker finds what is wrong with an agent: one that calls the outside world
//! before its idempotency key is durable, and one that keeps its progress only in memory,
//! each make an effect twice under the checker's crashes or evictions; their correct twins
//! pass. Its verdict does not depend on the machine's speed (real I/O inside an effect with
//! a timeout finishes before virtual time moves); it compares output streams and storage with
//! the baseline; it delivers external events, while the run waits and before; and it starts
//! each case with the options given; and, with storage durable at once, it shows an agent
//! what a re-entry at a stash finds written after it.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use durafiber_runtime::{
    Agent, AgentError, Budget, Ctx, EffectError, EffectOptions, Recovered, RunOptions, RunStatus,
};
use durafiber_testkit::{
    check::AgentCheck,
    upstream::{Upstream, post_idempotent},
};
use serde_json::{Value, json};

/// Charges once. `broken`: mints its key in memory and calls before anything is durable,
/// then stashes; correct: through an effect. `slow`: the effect has the README's policy
/// (five attempts, ten seconds each) and its call takes 100 ms of real time.
#[derive(Clone, Default)]
struct Charger {
    broken: bool,
    slow: bool,
    http: reqwest::Client,
}

impl Charger {
    async fn charge(
        &self,
        ctx: &mut Ctx<Self>,
        upstream: String,
        done: Option<String>,
    ) -> Result<String, AgentError> {
        if let Some(charged) = done {
            return Ok(charged);
        }
        let body = json!({"amount_cents": 500});
        let charge: Value = if self.broken {
            let key = format!(
                "charge-{}",
                durafiber_runtime::rng::unguessable_hex().map_err(|e| AgentError::fail(e.to_string()))?
            );
            post_idempotent(&self.http, &upstream, "charges", &key, None, &body)
                .await
                .map_err(AgentError::fail)?
        } else {
            let (http, slow) = (self.http.clone(), self.slow);
            let policy = match slow {
                true => EffectOptions {
                    attempts: 5,
                    timeout: Some(Duration::from_secs(10)),
                    limit: None,
                    ..Default::default()
                },
                false => EffectOptions::default(),
            };
            ctx.effect_with("charge", body, policy, move |key, body| {
                let (http, upstream) = (http.clone(), upstream.clone());
                async move {
                    if slow {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    post_idempotent(&http, &upstream, "charges", &key, None, &body)
                        .await
                        .map_err(EffectError::retryable)
                }
            })
            .await?
        };
        let charged = charge["object"].as_str().unwrap_or_default().to_string();
        ctx.stash("charged", &Some(charged.clone())).await?;
        Ok(charged)
    }
}

impl Agent for Charger {
    const KIND: &'static str = "charger";
    type Input = String;
    type Stash = Option<String>;
    type Output = String;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, upstream: String) -> Result<String, AgentError> {
        self.charge(ctx, upstream, None).await
    }

    async fn on_fiber_recovered(
        &self,
        ctx: &mut Ctx<Self>,
        r: Recovered<Self>,
    ) -> Result<String, AgentError> {
        self.charge(ctx, r.input, r.stash.flatten()).await
    }
}

/// Sends two emails. `broken`: counts what it sent in memory, which outlives an eviction
/// (the agent value stays) though the fiber's work is redone from its stash; correct: counts
/// in its stash.
#[derive(Clone, Default)]
struct Mailer {
    broken: bool,
    sent_in_memory: Arc<AtomicU32>,
    http: reqwest::Client,
}

impl Mailer {
    async fn send(&self, ctx: &mut Ctx<Self>, upstream: String, stashed: u32) -> Result<u32, AgentError> {
        let mut sent = if self.broken { self.sent_in_memory.load(Ordering::SeqCst) } else { stashed };
        while sent < 2 {
            let n = if self.broken { self.sent_in_memory.fetch_add(1, Ordering::SeqCst) } else { sent };
            let http = self.http.clone();
            let upstream = upstream.clone();
            let _: Value = ctx
                .effect(&format!("email:{n}"), json!({"email": sent}), move |key, body| {
                    let (http, upstream) = (http.clone(), upstream.clone());
                    async move {
                        post_idempotent(&http, &upstream, "emails", &key, None, &body)
                            .await
                            .map_err(EffectError::retryable)
                    }
                })
                .await?;
            sent += 1;
            ctx.stash("sent", &sent).await?;
        }
        Ok(sent)
    }
}

impl Agent for Mailer {
    const KIND: &'static str = "mailer";
    type Input = String;
    type Stash = u32;
    type Output = u32;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, upstream: String) -> Result<u32, AgentError> {
        self.send(ctx, upstream, 0).await
    }

    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, r: Recovered<Self>) -> Result<u32, AgentError> {
        self.send(ctx, r.input, r.stash.unwrap_or(0)).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_effect_made_before_its_key_is_durable_is_caught_and_the_correct_agent_passes() {
    let upstream = Arc::new(Upstream::start().await.expect("upstream"));
    let broken = AgentCheck::new(Charger { broken: true, ..Charger::default() })
        .input(&upstream.url())
        .upstream(upstream.clone())
        .crash_at_every_boundary()
        .run()
        .await;
    let failures = broken.failures();
    assert!(!failures.is_empty(), "the broken charger passed");
    assert!(
        failures
            .iter()
            .any(|c| c.problems.iter().any(|p| p.contains("made again")) && c.duplicated_effects.len() == 1),
        "{failures:#?}"
    );
    let panic = std::panic::catch_unwind(|| broken.assert_ok()).expect_err("assert_ok panics");
    let text = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(text.contains("effect on charges made again") && text.contains("events of"), "{text}");

    AgentCheck::new(Charger::default())
        .input(&upstream.url())
        .upstream(upstream.clone())
        .crash_at_every_boundary()
        .kill_during_effects()
        .eviction_matrix()
        .run()
        .await
        .assert_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_kept_only_in_memory_is_caught_and_the_correct_agent_passes() {
    let upstream = Arc::new(Upstream::start().await.expect("upstream"));
    let broken = Mailer { broken: true, ..Mailer::default() };
    let report = AgentCheck::new(broken)
        .input(&upstream.url())
        .upstream(upstream.clone())
        .eviction_matrix()
        .run()
        .await;
    let failures = report.failures();
    // Its counter outlives an eviction: the re-entered fiber skips emails it never sent.
    assert!(
        failures.iter().any(|c| !c.duplicated_effects.is_empty() || !c.missing_effects.is_empty()),
        "the broken mailer passed: {failures:#?}"
    );

    AgentCheck::new(Mailer::default())
        .input(&upstream.url())
        .upstream(upstream.clone())
        .crash_at_every_boundary()
        .kill_during_effects()
        .eviction_matrix()
        .run()
        .await
        .assert_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_io_inside_an_effect_with_a_timeout_finishes_before_virtual_time_moves() {
    let upstream = Arc::new(Upstream::start().await.expect("upstream"));
    let report = AgentCheck::new(Charger { slow: true, ..Charger::default() })
        .input(&upstream.url())
        .upstream(upstream.clone())
        .crash_at_every_boundary()
        .run()
        .await;
    assert!(
        matches!(report.baseline.final_state, Some(RunStatus::Completed { .. })),
        "the uninterrupted run: {:?}",
        report.baseline.final_state
    );
    assert_eq!(report.baseline.requests.len(), 1, "one call, no timeout: {:?}", report.baseline.requests);
    report.assert_ok();
}

/// Emits and stores a line per step, with a stash after each. `broken`: its recovery
/// forgets the line and the storage of the step it re-enters after.
#[derive(Clone, Default)]
struct Diarist {
    broken: bool,
}

impl Diarist {
    async fn write(&self, ctx: &mut Ctx<Self>, from: u32, recovered: bool) -> Result<u32, AgentError> {
        for day in from..3 {
            if !(self.broken && recovered && day == from) {
                ctx.emit(&format!("day {day}"))?;
                ctx.storage().put(&format!("day:{day}"), &day).await?;
            }
            ctx.stash("day", &(day + 1)).await?;
        }
        Ok(3)
    }
}

impl Agent for Diarist {
    const KIND: &'static str = "diarist";
    type Input = ();
    type Stash = u32;
    type Output = u32;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<u32, AgentError> {
        self.write(ctx, 0, false).await
    }

    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, r: Recovered<Self>) -> Result<u32, AgentError> {
        self.write(ctx, r.stash.unwrap_or(0), true).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_or_storage_unlike_the_baselines_is_caught() {
    let report = AgentCheck::new(Diarist { broken: true }).input(&()).eviction_matrix().run().await;
    let failures = report.failures();
    assert!(
        failures.iter().any(|c| c.problems.iter().any(|p| p.contains("output stream differs"))),
        "{failures:#?}"
    );
    assert!(
        failures.iter().any(|c| c.problems.iter().any(|p| p.contains("storage differs"))),
        "{failures:#?}"
    );
    assert!(failures.iter().all(|c| c.final_state == report.baseline.final_state), "only records differ");

    let report = AgentCheck::new(Diarist::default()).input(&()).crash_at_every_boundary().eviction_matrix();
    let report = report.run().await;
    assert_eq!(report.baseline.stream.len(), 3);
    assert_eq!(report.baseline.storage.len(), 3);
    report.assert_ok();
}

/// Waits an hour for the event `go` and returns its payload (or "late").
#[derive(Clone, Default)]
struct Listener;

impl Agent for Listener {
    const KIND: &'static str = "listener";
    type Input = ();
    type Stash = u32;
    type Output = String;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<String, AgentError> {
        ctx.stash("listening", &1).await?;
        let go: Option<String> = ctx.wait_for_event("go", Some(Duration::from_secs(3600))).await?;
        ctx.stash("heard", &2).await?;
        Ok(go.unwrap_or_else(|| "late".into()))
    }

    async fn on_fiber_recovered(
        &self,
        ctx: &mut Ctx<Self>,
        _: Recovered<Self>,
    ) -> Result<String, AgentError> {
        self.run_fiber(ctx, ()).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_is_delivered_while_the_run_waits_and_before() {
    let report = AgentCheck::new(Listener)
        .input(&())
        .send_event("go", json!("now"))
        .crash_at_every_boundary()
        .eviction_matrix()
        .run()
        .await;
    let completed = RunStatus::Completed { output_json: "\"now\"".into() };
    assert_eq!(report.baseline.final_state, Some(completed));
    assert!(report.cases.iter().any(|c| c.name == "events sent before the run waits"));
    report.assert_ok();
}

/// Makes two effects; a budget of one effect stops it at the second.
#[derive(Clone, Default)]
struct Spender;

impl Agent for Spender {
    const KIND: &'static str = "spender";
    type Input = ();
    type Stash = u32;
    type Output = u32;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<u32, AgentError> {
        for n in 0..2u32 {
            ctx.effect(&format!("spend:{n}"), n, |_key, n| async move { Ok::<u32, String>(n) }).await?;
            ctx.stash("spent", &(n + 1)).await?;
        }
        Ok(2)
    }

    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, _: Recovered<Self>) -> Result<u32, AgentError> {
        self.run_fiber(ctx, ()).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_case_starts_with_the_options_given() {
    let budget = Budget { effects_max: Some(1), ..Budget::default() };
    let report = AgentCheck::new(Spender)
        .input(&())
        .options(RunOptions { budget, ..RunOptions::default() })
        .crash_at_every_boundary()
        .run()
        .await;
    let Some(RunStatus::Escalated { reason }) = &report.baseline.final_state else {
        panic!("the budget did not stop the run: {:?}", report.baseline.final_state)
    };
    assert!(reason.contains("budget"), "{reason}");
    report.assert_ok();
}

/// Counts its steps in storage, with a stash after each. `broken`: adds one to the count it
/// reads, which a re-entry at a stash repeats when the write after it survived (it does on
/// PostgreSQL); correct: writes the count its step reached, which a repeat writes again.
#[derive(Clone, Default)]
struct Tally {
    broken: bool,
}

impl Tally {
    async fn count(&self, ctx: &mut Ctx<Self>, from: u32) -> Result<u32, AgentError> {
        for step in from..3 {
            let n: u32 = if self.broken { ctx.storage().get("n")?.unwrap_or(0) + 1 } else { step + 1 };
            ctx.storage().put("n", &n).await?;
            ctx.stash("step", &(step + 1)).await?;
        }
        Ok(ctx.storage().get("n")?.unwrap_or(0))
    }
}

impl Agent for Tally {
    const KIND: &'static str = "tally";
    type Input = ();
    type Stash = u32;
    type Output = u32;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<u32, AgentError> {
        self.count(ctx, 0).await
    }

    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, r: Recovered<Self>) -> Result<u32, AgentError> {
        self.count(ctx, r.stash.unwrap_or(0)).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_that_outlives_the_stash_after_it_is_shown_to_the_agent() {
    // With storage durable only with the next boundary, the broken tally never counts twice.
    AgentCheck::new(Tally { broken: true }).input(&()).crash_at_every_boundary().run().await.assert_ok();
    let report = AgentCheck::new(Tally { broken: true }).input(&()).storage_durable_at_once().run().await;
    let failures = report.failures();
    assert!(
        failures
            .iter()
            .any(|c| c.name.contains("durable at once") && c.final_state != report.baseline.final_state),
        "a step counted twice is caught: {failures:#?}"
    );
    let correct =
        AgentCheck::new(Tally::default()).input(&()).crash_at_every_boundary().storage_durable_at_once();
    correct.run().await.assert_ok();
}
