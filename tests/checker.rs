//! The public checker finds what is wrong with an agent: one that calls the outside world
//! before its idempotency key is durable, and one that keeps its progress only in memory,
//! each make an effect twice under the checker's crashes or evictions; their correct twins
//! pass.

use std::sync::{
    Arc,
    atomic::{AtomicU32, Ordering},
};

use durafiber_runtime::{Agent, AgentError, Ctx, EffectError, Recovered};
use durafiber_testkit::{
    check::AgentCheck,
    upstream::{Upstream, post_idempotent},
};
use serde_json::{Value, json};

/// Charges once. `broken`: mints its key in memory and calls before anything is durable,
/// then stashes; correct: through `ctx.effect`.
#[derive(Clone, Default)]
struct Charger {
    broken: bool,
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
            let http = self.http.clone();
            ctx.effect("charge", body, move |key, body| {
                let (http, upstream) = (http.clone(), upstream.clone());
                async move {
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
