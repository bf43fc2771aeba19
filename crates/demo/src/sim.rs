//! `durafiber sim`: simulations on the virtual clock, in milliseconds of wall time.
//!
//! - `eviction`: an idle run, a run holding a keep-alive for 10 minutes, and a run mid-fiber
//!   without keep-alive; shows hibernation, heartbeats, eviction and recovery.
//! - `alarm-retry`: an alarm whose handler fails K times; shows the retry schedule.

use durafiber_runtime::RunId;
use durafiber_runtime::StartRequest;
use durafiber_runtime::Timestamp;
use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU32, Ordering},
    },
    time::Duration,
};

use anyhow::Context as _;
use durafiber_runtime::{
    Agent, AgentError, AlarmEvent, AlarmSpec, Ctx, Event, ExhaustedAction, Recovered, RunOptions, Runtime,
    RuntimeConfig, clock::VirtualClock,
};
use durafiber_store::{SimBackend, Store, StoreConfig};
use serde::Serialize;

pub use durafiber_testkit::SIM_EPOCH_MS;

/// The eviction lab's agent: `idle` finishes at once; `fiber` stashes and then waits an
/// hour in memory, which eviction interrupts.
struct Lab;

impl Agent for Lab {
    const KIND: &'static str = "lab";
    type Input = String;
    type Stash = String;
    type Output = String;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, mode: String) -> Result<String, AgentError> {
        if mode == "fiber" {
            ctx.stash("working", &"halfway".to_string()).await?;
            ctx.sleep_in_memory(Duration::from_secs(3600)).await;
        }
        Ok(mode)
    }

    async fn on_fiber_recovered(
        &self,
        ctx: &mut Ctx<Self>,
        r: Recovered<Self>,
    ) -> Result<String, AgentError> {
        ctx.stash("recovered", &format!("from {:?} at seq {}", r.step, r.seq)).await?;
        Ok(r.input)
    }
}

async fn sim_runtime<A: Agent>(seed: u64, agent: A) -> anyhow::Result<(Runtime, VirtualClock)> {
    let clock = VirtualClock::new(Timestamp::from_millis(SIM_EPOCH_MS));
    let store = Store::with_backend(Arc::new(SimBackend::new()), StoreConfig::default())?;
    let config = RuntimeConfig { seed, ..RuntimeConfig::default() };
    let rt = Runtime::builder(store).config(config).virtual_clock(clock.clone()).agent(agent).open().await?;
    Ok((rt, clock))
}

/// The figures `sim eviction` prints on its last line.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvictionReport {
    /// The seed of every draw.
    pub seed: u64,
    /// Start of the idle run → its hibernation.
    pub idle_hibernated_after_ms: Option<u64>,
    /// Whether the keep-alive run was evicted while the guard was held (it must not be).
    pub keepalive_evicted: bool,
    /// Heartbeats counted while the guard was held.
    pub keepalive_heartbeats: u64,
    /// Release of the guard → hibernation.
    pub keepalive_hibernated_after_release_ms: Option<u64>,
    /// Start of the fiber run → its eviction.
    pub fiber_evicted_after_ms: Option<u64>,
    /// Whether the evicted run was recovered by the runtime itself.
    pub fiber_recovered: bool,
}

/// How long after `after` the run's first event `kind` came, ms.
fn first_after(events: &[Event], run_id: &RunId, kind: &str, after: Timestamp) -> Option<u64> {
    let first = events.iter().find(|e| e.run_id == *run_id && e.kind == kind && e.at_ms >= after)?;
    u64::try_from(first.at_ms.saturating_since(after).as_millis()).ok()
}

/// A readable line per event, times relative to the simulation's start.
pub fn timeline(events: &[Event], names: &[(&str, &str)]) -> Vec<String> {
    events
        .iter()
        .map(|e| {
            let name = names.iter().find(|(id, _)| *id == e.run_id).map(|(_, n)| *n).unwrap_or("?");
            let t = e.at_ms.as_millis().saturating_sub(SIM_EPOCH_MS);
            let detail = if e.kind == "activated" { "" } else { e.detail.as_str() };
            format!("t=+{:>9.3}s  {name:<10} {:<20} {detail}", t as f64 / 1000.0, e.kind)
        })
        .collect()
}

/// Runs the eviction simulation; returns the timeline and the report.
pub async fn eviction(seed: u64) -> anyhow::Result<(Vec<String>, EvictionReport)> {
    let (rt, _clock) = sim_runtime(seed, Lab).await?;
    let t0 = rt.now();
    let idle = rt.start::<Lab>("idle", &"idle".to_string()).await?.run_id;
    let kept = rt.start::<Lab>("keepalive", &"idle".to_string()).await?.run_id;
    let no_keep_alive = RunOptions { fiber_keep_alive: Some(false), ..RunOptions::default() };
    let fiber = rt
        .start_run(StartRequest::new(Lab::KIND, "fiber", "fiber".into()).with_options(no_keep_alive))
        .await?
        .run_id;
    let guard = rt.keep_alive(&kept).await?;
    rt.advance(Duration::from_secs(600)).await?;
    let released_at = rt.now();
    drop(guard);
    rt.advance(Duration::from_secs(120)).await?;

    let events = rt.events();
    let heartbeats_while_held =
        events.iter().filter(|e| e.run_id == kept && e.kind == "heartbeat" && e.at_ms <= released_at).count();
    let report = EvictionReport {
        seed,
        idle_hibernated_after_ms: first_after(&events, &idle, "hibernated", t0),
        keepalive_evicted: events.iter().any(|e| e.run_id == kept && e.kind == "evicted"),
        keepalive_heartbeats: heartbeats_while_held as u64,
        keepalive_hibernated_after_release_ms: first_after(&events, &kept, "hibernated", released_at),
        fiber_evicted_after_ms: first_after(&events, &fiber, "evicted", t0),
        fiber_recovered: matches!(rt.status(&fiber)?, durafiber_runtime::RunStatus::Completed { .. })
            && events.iter().any(|e| e.run_id == fiber && e.kind == "recovered"),
    };
    let names = [(idle.as_str(), "idle"), (kept.as_str(), "keepalive"), (fiber.as_str(), "fiber")];
    let lines = timeline(&events, &names);
    rt.shutdown().await;
    Ok((lines, report))
}

/// An agent whose alarm handler fails its first `fail_times` deliveries (or always).
struct Flaky {
    fail_times: Option<u32>,
    calls: Arc<AtomicU32>,
    exhausted: Arc<AtomicBool>,
}

impl Agent for Flaky {
    const KIND: &'static str = "flaky";
    type Input = ();
    type Stash = ();
    type Output = ();
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<(), AgentError> {
        ctx.set_alarm("default", AlarmSpec::after(Duration::from_secs(1), &"ping")?).await?;
        // The run stays open while its alarm is pending: alarms of a finished run are removed.
        ctx.cancelled().await;
        Ok(())
    }

    async fn on_alarm(&self, _: &mut Ctx<Self>, _: AlarmEvent) -> Result<(), AgentError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        match self.fail_times {
            Some(k) if n > k => Ok(()),
            _ => Err(AgentError::fail(format!("simulated failure {n}"))),
        }
    }

    fn on_alarm_exhausted(&self, _: &Ctx<Self>, _: &AlarmEvent) -> ExhaustedAction {
        self.exhausted.store(true, Ordering::SeqCst);
        ExhaustedAction::Escalate
    }
}

/// The figures `sim alarm-retry` prints on its last line.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AlarmRetryReport {
    /// The seed of the jitter.
    pub seed: u64,
    /// Deliveries made.
    pub attempts: u32,
    /// Time between consecutive deliveries.
    pub delays_ms: Vec<u64>,
    /// Whether the alarm was abandoned to a dead letter.
    pub dead_lettered: bool,
    /// Whether `on_alarm_exhausted` ran.
    pub exhausted_hook_ran: bool,
    /// Whether a delivery succeeded.
    pub succeeded: bool,
}

/// Runs the alarm-retry simulation; returns the timeline and the report.
pub async fn alarm_retry(
    seed: u64,
    fail_times: Option<u32>,
) -> anyhow::Result<(Vec<String>, AlarmRetryReport)> {
    let calls = Arc::new(AtomicU32::new(0));
    let exhausted = Arc::new(AtomicBool::new(false));
    let agent = Flaky { fail_times, calls: calls.clone(), exhausted: exhausted.clone() };
    let (rt, _clock) = sim_runtime(seed, agent).await?;
    let run = rt.start::<Flaky>("alarm", &()).await.context("start")?.run_id;
    // Seven attempts span at most 1 + 2.5 + 5 + 10 + 20 + 40 + 80 s; ten minutes is plenty.
    rt.advance(Duration::from_secs(600)).await?;
    let events = rt.events();
    let attempts: Vec<u64> = events
        .iter()
        .filter(|e| e.run_id == run && e.kind == "alarm_attempt")
        .map(|e| e.at_ms.as_millis())
        .collect();
    let report = AlarmRetryReport {
        seed,
        attempts: attempts.len() as u32,
        delays_ms: attempts.windows(2).map(|w| w[1] - w[0]).collect(),
        dead_lettered: rt.metrics().dead_letters > 0,
        exhausted_hook_ran: exhausted.load(Ordering::SeqCst),
        succeeded: events.iter().any(|e| e.run_id == run && e.kind == "alarm_done"),
    };
    let shown: Vec<Event> = events.into_iter().filter(|e| e.kind != "heartbeat").collect();
    let lines = timeline(&shown, &[(run.as_str(), "alarm-run")]);
    rt.shutdown().await;
    Ok((lines, report))
}
