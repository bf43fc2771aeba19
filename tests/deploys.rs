//! A deploy at every boundary (`AgentCheck::deploy_at_every_boundary`): a run of v1 crashed
//! right after each boundary it passes is carried on by v2 — a reworded progress chunk and a
//! new stash version with its upgrade — to the end the uninterrupted run reached, with no
//! effect made twice, also when v2's process is killed at its first boundary (the upgraded
//! stash's write). A v2 that books with other arguments is caught where it would escalate.

use std::sync::Arc;

use durafiber_runtime::{Agent, AgentError, Ctx, Recovered, RuntimeConfig};
use durafiber_testkit::{
    check::AgentCheck,
    upstream::{Upstream, post_idempotent},
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Trip {
    upstream: String,
    city: String,
}

/// The steps after the plan's stash: book, say so, wait for the payment, stash `paid` (in
/// the running version's shape: after a deploy, the upgraded stash's first write), confirm.
async fn after_plan<A: Agent>(
    ctx: &mut Ctx<A>,
    trip: &Trip,
    by: &str,
    nights: u32,
    paid: A::Stash,
) -> Result<String, AgentError> {
    let http = reqwest::Client::new();
    let base = trip.upstream.clone();
    let booked: Value = ctx
        .effect("hotel", json!({"city": trip.city, "nights": nights}), move |key, args| {
            let (http, base) = (http.clone(), base.clone());
            async move { post_idempotent(&http, &base, "bookings", &key, None, &args).await }
        })
        .await?;
    ctx.emit(&json!({"text": "payment:waiting", "by": by}))?;
    let _: Option<Value> = ctx.wait_for_event("payment", None).await?;
    ctx.stash("paid", &paid).await?;
    ctx.emit(&json!({"text": "confirmed"}))?;
    Ok(booked["id"].as_str().unwrap_or_default().to_string())
}

/// Version 1: its stash is `{city}`.
#[derive(Clone)]
struct TripV1;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct PlannedV1 {
    city: String,
}

impl Agent for TripV1 {
    const KIND: &'static str = "trip";
    type Input = Trip;
    type Stash = PlannedV1;
    type Output = String;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, trip: Trip) -> Result<String, AgentError> {
        ctx.emit(&json!({"text": "planning"}))?;
        let planned = PlannedV1 { city: trip.city.clone() };
        ctx.stash("planned", &planned).await?;
        after_plan(ctx, &trip, "v1", 2, planned).await
    }

    async fn on_fiber_recovered(
        &self,
        ctx: &mut Ctx<Self>,
        r: Recovered<Self>,
    ) -> Result<String, AgentError> {
        match r.stash {
            Some(planned) => after_plan(ctx, &r.input, "v1", 2, planned).await,
            None => self.run_fiber(ctx, r.input).await,
        }
    }
}

/// Version 2: its stash is `{destination, travellers}`, upgraded from 1; it says `v2`, and
/// books `NIGHTS` nights.
#[derive(Clone)]
struct TripV2<const NIGHTS: u32>;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct PlannedV2 {
    destination: String,
    travellers: u32,
}

impl<const NIGHTS: u32> Agent for TripV2<NIGHTS> {
    const KIND: &'static str = "trip";
    const STASH_VERSION: u32 = 2;
    type Input = Trip;
    type Stash = PlannedV2;
    type Output = String;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, trip: Trip) -> Result<String, AgentError> {
        ctx.emit(&json!({"text": "planning"}))?;
        let planned = PlannedV2 { destination: trip.city.clone(), travellers: 1 };
        ctx.stash("planned", &planned).await?;
        after_plan(ctx, &trip, "v2", NIGHTS, planned).await
    }

    async fn on_fiber_recovered(
        &self,
        ctx: &mut Ctx<Self>,
        r: Recovered<Self>,
    ) -> Result<String, AgentError> {
        match r.stash {
            // Upgraded from version 1 when the run was stashed by v1.
            Some(planned) => after_plan(ctx, &r.input, "v2", NIGHTS, planned).await,
            None => self.run_fiber(ctx, r.input).await,
        }
    }

    fn upgrade_stash(from_version: u32, old: Value) -> Result<PlannedV2, AgentError> {
        match from_version {
            1 => {
                let v1: PlannedV1 =
                    serde_json::from_value(old).map_err(|e| AgentError::fail(e.to_string()))?;
                Ok(PlannedV2 { destination: v1.city, travellers: 1 })
            }
            v => Err(AgentError::escalate(format!("no upgrade from {v}"))),
        }
    }
}

fn check(upstream: &Arc<Upstream>) -> AgentCheck<TripV1> {
    AgentCheck::new(TripV1)
        .input(&Trip { upstream: upstream.url(), city: "lyon".into() })
        .upstream(upstream.clone())
        .send_event("payment", json!({"paid": true}))
        .virtual_time(std::time::Duration::from_secs(120))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_at_every_boundary_escalates_nothing_and_pays_nothing_twice() {
    let upstream = Arc::new(Upstream::start().await.expect("upstream"));
    let report = check(&upstream).deploy_at_every_boundary(TripV2::<2>).run().await;
    report.assert_ok();
    let deploys = report.cases.iter().filter(|c| c.name.starts_with("deployed after")).count();
    assert!(deploys >= 6, "a deploy after each boundary, killed and not: {deploys}");
    for case in std::iter::once(&report.baseline).chain(&report.cases) {
        assert_eq!(case.upstream.len(), 1, "{}: one booking", case.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_that_books_with_other_arguments_is_caught_where_it_would_escalate() {
    let upstream = Arc::new(Upstream::start().await.expect("upstream"));
    // Escalated at its first failed recovery, as it would be after its attempts.
    let config = RuntimeConfig { max_recover_attempts: 1, ..RuntimeConfig::default() };
    let report = check(&upstream).config(config).deploy_at_every_boundary(TripV2::<3>).run().await;
    let failures = report.failures();
    assert!(!failures.is_empty(), "a conflicting deploy passed the check");
    let escalated = failures
        .iter()
        .filter(|c| c.problems.iter().any(|p| p.contains("Escalated") && p.contains("hotel")))
        .count();
    assert!(escalated > 0, "{:?}", failures.iter().map(|c| (&c.name, &c.problems)).collect::<Vec<_>>());
}
