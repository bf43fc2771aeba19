//! The crash and eviction checker: point it at any agent and it runs the agent's run through
//! every crash point and eviction it can reach, on the crash-simulating store and a virtual
//! clock, and says what broke.
//!
//! Each case starts from a fresh simulated disk and must end the way the uninterrupted run
//! (the *baseline*) ended — the same state, the same output — with the same side effects
//! upstream: no effect twice, none missing, none new. Cases:
//!
//! - **crash at every boundary** ([`AgentCheck::crash_at_every_boundary`]): for each boundary
//!   a dry run passes (a stash, an effect's prepare or commit, an approval request), the store
//!   crashes right after it, and for each store write, right after the write is applied and
//!   before its barrier (the write is lost). A new runtime opens the same disk and drives the
//!   run to its end.
//! - **kill during effects** ([`AgentCheck::kill_during_effects`]): the store crashes after an
//!   effect's call returned and before its receipt is committed: the upstream has seen the
//!   call, the ledger has not.
//! - **eviction matrix** ([`AgentCheck::eviction_matrix`]): evicted at each boundary in turn,
//!   then chaos evictions with each seed of [`AgentCheck::seeds`].
//!
//! ```no_run
//! # use durafiber_runtime::{Agent, AgentError, Ctx, Recovered};
//! # #[derive(Clone)]
//! # struct Refund;
//! # impl Agent for Refund {
//! #     const KIND: &'static str = "refund";
//! #     type Input = u64;
//! #     type Stash = ();
//! #     type Output = bool;
//! #     type Message = ();
//! #     async fn run_fiber(&self, ctx: &mut Ctx<Self>, cents: u64) -> Result<bool, AgentError> {
//! #         Ok(ctx.request_approval("refund", &cents).await?.approved)
//! #     }
//! #     async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, r: Recovered<Self>) -> Result<bool, AgentError> {
//! #         self.run_fiber(ctx, r.input).await
//! #     }
//! # }
//! # async fn check() {
//! use durafiber_testkit::{check::AgentCheck, upstream::Upstream};
//!
//! // An upstream that counts its own objects, so "once" is checked where it happened.
//! let upstream = std::sync::Arc::new(Upstream::start().await.expect("upstream"));
//! AgentCheck::new(Refund)
//!     .input(&4_200u64)
//!     .upstream(upstream)
//!     .approve_with(|_pending| durafiber_runtime::Decision { approved: true, comment: "ok".into() })
//!     .crash_at_every_boundary()
//!     .kill_during_effects()
//!     .eviction_matrix()
//!     .run()
//!     .await
//!     .assert_ok();
//! # }
//! ```

use std::{
    collections::BTreeMap,
    fmt,
    ops::Range,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use crate::{SIM_EPOCH_MS, upstream::Upstream};
use durafiber_runtime::{
    Agent, CrashHook, Decision, Event, PendingApproval, RunStatus, Runtime, RuntimeConfig,
    clock::VirtualClock, testing::BuilderTestExt,
};
use durafiber_store::{SimBackend, Store, StoreConfig};
use parking_lot::Mutex;
use serde_json::Value;

/// Where a case crashes, named after the boundary a dry run passed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum CrashPoint {
    /// Right after the stash at this step was committed.
    AfterStash(String),
    /// Right after this effect's idempotency key was committed, before its call.
    AfterEffectPrepare(String),
    /// After this effect's call returned, before its receipt was committed.
    AfterEffectCall(String),
    /// Right after this effect's receipt was committed.
    AfterEffectCommit(String),
    /// Right after this approval's pause was committed.
    AfterApprovalRequest(String),
    /// Another named boundary.
    Other(String),
    /// Store write number `n` (from the run's start), lost: the crash comes after it was
    /// applied and before its barrier.
    WriteLost(u64),
}

impl CrashPoint {
    /// The point named `after_stash:<step>`, `after_effect_prepare:<id>`, ... by the runtime.
    pub fn parse(name: &str) -> CrashPoint {
        let (kind, arg) = name.split_once(':').unwrap_or((name, ""));
        let arg = arg.to_string();
        match kind {
            "after_stash" => CrashPoint::AfterStash(arg),
            "after_effect_prepare" => CrashPoint::AfterEffectPrepare(arg),
            "after_effect_call" => CrashPoint::AfterEffectCall(arg),
            "after_effect_commit" => CrashPoint::AfterEffectCommit(arg),
            "after_approval_request" => CrashPoint::AfterApprovalRequest(arg),
            _ => CrashPoint::Other(name.to_string()),
        }
    }
}

impl fmt::Display for CrashPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CrashPoint::AfterStash(s) => write!(f, "after stash {s:?}"),
            CrashPoint::AfterEffectPrepare(s) => write!(f, "after effect {s:?} was prepared"),
            CrashPoint::AfterEffectCall(s) => write!(f, "after effect {s:?} was called, before its receipt"),
            CrashPoint::AfterEffectCommit(s) => write!(f, "after effect {s:?} was committed"),
            CrashPoint::AfterApprovalRequest(s) => write!(f, "after approval {s:?} was requested"),
            CrashPoint::Other(s) => write!(f, "at {s}"),
            CrashPoint::WriteLost(n) => write!(f, "with store write {n} lost before its barrier"),
        }
    }
}

/// The outside world a checked agent calls: reset before each case, counted after it.
pub trait CheckUpstream: Send + Sync {
    /// Forgets every object.
    fn reset(&self);
    /// Every object created since the reset: `(collection, idempotency key, request body)`.
    fn objects(&self) -> Vec<(String, String, Value)>;
}

impl CheckUpstream for Upstream {
    fn reset(&self) {
        Upstream::reset(self);
    }

    fn objects(&self) -> Vec<(String, String, Value)> {
        self.all()
            .into_iter()
            .map(|(collection, o)| {
                let key = o["idempotency_key"].as_str().unwrap_or_default().to_string();
                (collection, key, o["request"].clone())
            })
            .collect()
    }
}

type Approver = Arc<dyn Fn(&PendingApproval) -> Decision + Send + Sync>;
type OutputMatch = Arc<dyn Fn(&Value, &Value) -> bool + Send + Sync>;

/// A crash and eviction check of one agent's run; see the [module](self) documentation.
pub struct AgentCheck<A: Agent + Clone> {
    agent: A,
    input: Option<Value>,
    crashes: bool,
    effect_kills: bool,
    evictions: bool,
    seeds: Range<u64>,
    approver: Option<Approver>,
    upstream: Option<Arc<dyn CheckUpstream>>,
    time_limit: Duration,
    config: RuntimeConfig,
    output_matches: Option<OutputMatch>,
}

/// One case's outcome.
#[derive(Debug, Clone)]
pub struct CaseReport {
    /// What was done to the run.
    pub name: String,
    /// Where it crashed, for a crash case.
    pub crash_point: Option<CrashPoint>,
    /// The run's final state; `None` if it did not finish within the time limit.
    pub final_state: Option<RunStatus>,
    /// Upstream objects per idempotency key.
    pub upstream: BTreeMap<String, usize>,
    /// Every upstream request, `(collection, request body)`, in the order made.
    pub requests: Vec<(String, Value)>,
    /// Upstream requests made more than once under different keys, or not made at all by
    /// the baseline: `(collection, request body)`.
    pub duplicated_effects: Vec<(String, Value)>,
    /// Upstream requests the baseline made that this case did not.
    pub missing_effects: Vec<(String, Value)>,
    /// Runs the liveness rule found left behind while the case ran.
    pub liveness_violations: Vec<String>,
    /// What went wrong, in words; empty when the case passed.
    pub problems: Vec<String>,
    /// The runtime's event log of the case's last process.
    pub events: Vec<Event>,
}

impl CaseReport {
    /// No problem found.
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Every case of a check, beside the uninterrupted run.
#[derive(Debug, Clone)]
pub struct CheckReport {
    /// The run with nothing done to it.
    pub baseline: CaseReport,
    /// Every other case, in the order run.
    pub cases: Vec<CaseReport>,
}

impl CheckReport {
    /// The cases with a problem, the baseline first if it has one.
    pub fn failures(&self) -> Vec<&CaseReport> {
        std::iter::once(&self.baseline).chain(&self.cases).filter(|c| !c.ok()).collect()
    }

    /// Panics, readably, unless every case passed: each failing case's problems, and the
    /// event log of the first.
    pub fn assert_ok(&self) {
        let failures = self.failures();
        let Some(first) = failures.first() else { return };
        let mut text = format!("{} of {} cases failed:\n", failures.len(), self.cases.len() + 1);
        for case in &failures {
            text.push_str(&format!("- {}:\n", case.name));
            for problem in &case.problems {
                text.push_str(&format!("    {problem}\n"));
            }
        }
        text.push_str(&format!(
            "\nbaseline: {:?}\nevents of \"{}\":\n",
            self.baseline.final_state, first.name
        ));
        for e in &first.events {
            text.push_str(&format!("  {} {} {}\n", e.at_ms.saturating_sub(SIM_EPOCH_MS), e.kind, e.detail));
        }
        panic!("{text}");
    }
}

/// What is done to one case.
#[derive(Clone, Default)]
struct Trouble {
    /// Crash the store right after the n-th boundary (1-based).
    crash_after_boundary: Option<usize>,
    /// Crash the store right after write n is applied.
    lose_write: Option<u64>,
    /// Evict the run at the n-th boundary.
    evict_at_boundary: Option<usize>,
    /// Chaos evictions with this seed.
    chaos_seed: Option<u64>,
}

/// What a dry run saw.
struct Dry {
    report: CaseReport,
    boundaries: Vec<String>,
    writes: u64,
}

impl<A: Agent + Clone> AgentCheck<A> {
    /// A check of `agent`; give it an input, then choose the cases.
    pub fn new(agent: A) -> Self {
        AgentCheck {
            agent,
            input: None,
            crashes: false,
            effect_kills: false,
            evictions: false,
            seeds: 1..4,
            approver: None,
            upstream: None,
            time_limit: Duration::from_secs(3600),
            config: RuntimeConfig::default(),
            output_matches: None,
        }
    }

    /// The run's input.
    pub fn input(mut self, input: &A::Input) -> Self {
        self.input = serde_json::to_value(input).ok();
        self
    }

    /// Crash after every boundary, and lose every store write in turn.
    pub fn crash_at_every_boundary(mut self) -> Self {
        self.crashes = true;
        self
    }

    /// Crash between each effect's call and its receipt's commit.
    pub fn kill_during_effects(mut self) -> Self {
        self.effect_kills = true;
        self
    }

    /// Evict at every boundary in turn, then with seeded chaos.
    pub fn eviction_matrix(mut self) -> Self {
        self.evictions = true;
        self
    }

    /// The seeds of the chaos evictions (default `1..4`).
    pub fn seeds(mut self, seeds: Range<u64>) -> Self {
        self.seeds = seeds;
        self
    }

    /// How a pending approval is decided (default: none is; a run that asks waits forever).
    pub fn approve_with(
        mut self,
        decide: impl Fn(&PendingApproval) -> Decision + Send + Sync + 'static,
    ) -> Self {
        self.approver = Some(Arc::new(decide));
        self
    }

    /// The outside world the agent calls, to count its effects per case.
    pub fn upstream(mut self, upstream: Arc<dyn CheckUpstream>) -> Self {
        self.upstream = Some(upstream);
        self
    }

    /// How much virtual time a case may take to finish (default one hour).
    pub fn virtual_time(mut self, limit: Duration) -> Self {
        self.time_limit = limit;
        self
    }

    /// How a case's output is compared with the uninterrupted run's (default: equal), for an
    /// agent whose output tells its own history (how often it was recovered).
    pub fn output_matches(mut self, same: impl Fn(&Value, &Value) -> bool + Send + Sync + 'static) -> Self {
        self.output_matches = Some(Arc::new(same));
        self
    }

    /// The runtime configuration every case starts from.
    pub fn config(mut self, config: RuntimeConfig) -> Self {
        self.config = config;
        self
    }

    /// The crash points a dry run passes, in order.
    pub async fn crash_points(&self) -> Vec<CrashPoint> {
        let dry = self.dry_run().await;
        let mut points: Vec<CrashPoint> = dry.boundaries.iter().map(|b| CrashPoint::parse(b)).collect();
        points.extend((1..=dry.writes).map(CrashPoint::WriteLost));
        points
    }

    /// Runs every chosen case.
    pub async fn run(&self) -> CheckReport {
        let dry = self.dry_run().await;
        let baseline = dry.report;
        let mut cases = Vec::new();
        if self.crashes || self.effect_kills {
            for (i, name) in dry.boundaries.iter().enumerate() {
                let point = CrashPoint::parse(name);
                let wanted = match point {
                    CrashPoint::AfterEffectCall(_) => self.effect_kills || self.crashes,
                    _ => self.crashes,
                };
                if wanted {
                    let trouble = Trouble { crash_after_boundary: Some(i + 1), ..Trouble::default() };
                    let case = format!("crash {point} (boundary {})", i + 1);
                    cases.push(self.case(&case, Some(point), trouble, &baseline).await);
                }
            }
        }
        if self.crashes {
            for n in 1..=dry.writes {
                let trouble = Trouble { lose_write: Some(n), ..Trouble::default() };
                let point = CrashPoint::WriteLost(n);
                cases.push(self.case(&format!("crash {point}"), Some(point), trouble, &baseline).await);
            }
        }
        if self.evictions {
            for k in 1..=dry.boundaries.len() {
                let trouble = Trouble { evict_at_boundary: Some(k), ..Trouble::default() };
                let name = format!("evicted at boundary {k} ({})", dry.boundaries[k - 1]);
                cases.push(self.case(&name, None, trouble, &baseline).await);
            }
            for seed in self.seeds.clone() {
                let trouble = Trouble { chaos_seed: Some(seed), ..Trouble::default() };
                cases.push(
                    self.case(&format!("chaos evictions, seed {seed}"), None, trouble, &baseline).await,
                );
            }
        }
        CheckReport { baseline, cases }
    }

    async fn dry_run(&self) -> Dry {
        let boundaries = Arc::new(Mutex::new(Vec::new()));
        let (report, writes) =
            self.play("baseline", None, Trouble::default(), None, Some(boundaries.clone())).await;
        let boundaries = boundaries.lock().clone();
        Dry { report, boundaries, writes }
    }

    async fn case(
        &self,
        name: &str,
        point: Option<CrashPoint>,
        trouble: Trouble,
        baseline: &CaseReport,
    ) -> CaseReport {
        self.play(name, point, trouble, Some(baseline), None).await.0
    }

    async fn open(
        &self,
        sim: &SimBackend,
        now_ms: u64,
        config: RuntimeConfig,
        hook: Option<CrashHook>,
    ) -> Result<Runtime, String> {
        let store = Store::with_backend(Arc::new(sim.clone()), StoreConfig::default())
            .map_err(|e| format!("the simulated store does not open: {e}"))?;
        let mut builder = Runtime::builder(store)
            .config(config)
            .virtual_clock(VirtualClock::new(now_ms))
            .agent(self.agent.clone());
        if let Some(hook) = hook {
            builder = builder.crash_hook(hook);
        }
        builder.open().await.map_err(|e| format!("the runtime does not open: {e}"))
    }

    /// Plays one case; returns its report and how many store writes it made.
    async fn play(
        &self,
        name: &str,
        crash_point: Option<CrashPoint>,
        trouble: Trouble,
        baseline: Option<&CaseReport>,
        record_boundaries: Option<Arc<Mutex<Vec<String>>>>,
    ) -> (CaseReport, u64) {
        if let Some(upstream) = &self.upstream {
            upstream.reset();
        }
        let mut report = CaseReport {
            name: name.to_string(),
            crash_point,
            final_state: None,
            upstream: BTreeMap::new(),
            requests: Vec::new(),
            duplicated_effects: Vec::new(),
            missing_effects: Vec::new(),
            liveness_violations: Vec::new(),
            problems: Vec::new(),
            events: Vec::new(),
        };
        let Some(input) = &self.input else {
            report.problems.push("no input: call .input(&input)".into());
            return (report, 0);
        };
        let sim = SimBackend::new();
        if let Some(n) = trouble.lose_write {
            sim.crash_at(durafiber_store::CrashPoint::AfterApply(n));
        }
        let mut config = self.config.clone();
        if let Some(seed) = trouble.chaos_seed {
            config = RuntimeConfig { seed, chaos_evict_rate: 0.3, ..config };
        }
        let passed = Arc::new(AtomicUsize::new(0));
        let hook: CrashHook = {
            let (sim, passed, record) = (sim.clone(), passed.clone(), record_boundaries.clone());
            let trouble = trouble.clone();
            Arc::new(move |_, point| {
                let n = passed.fetch_add(1, Ordering::SeqCst) + 1;
                if let Some(record) = &record {
                    record.lock().push(point.to_string());
                }
                if trouble.crash_after_boundary == Some(n) {
                    sim.crash();
                }
                trouble.evict_at_boundary == Some(n)
            })
        };
        let rt = match self.open(&sim, SIM_EPOCH_MS, config.clone(), Some(hook)).await {
            Ok(rt) => rt,
            Err(e) => {
                report.problems.push(e);
                return (report, 0);
            }
        };
        let key = "checked-run";
        let started = rt.start_json(A::KIND, key, &input.to_string(), Default::default()).await;
        let mut run_id = started.as_ref().ok().map(|s| s.run_id.to_string());
        let mut status = None;
        if let Some(id) = &run_id {
            status = self.drive(&rt, &sim, id, &mut report).await;
        }
        let (writes, _) = sim.counts();
        if sim.is_crashed() {
            // The process dies with the store; a new one opens what the disk kept.
            let now = rt.now_ms();
            rt.shutdown().await;
            sim.revive();
            let rt = match self.open(&sim, now, config, None).await {
                Ok(rt) => rt,
                Err(e) => {
                    report.problems.push(format!("after the crash, {e}"));
                    return (report, writes);
                }
            };
            // A caller that saw no answer starts again with the same key.
            let again = rt.start_json(A::KIND, key, &input.to_string(), Default::default()).await;
            match (&run_id, again) {
                (Some(id), Ok(out)) if out.run_id.as_str() != id => {
                    report.problems.push(format!("the key's run changed from {id} to {}", out.run_id))
                }
                (_, Ok(out)) => run_id = Some(out.run_id.to_string()),
                (_, Err(e)) => report.problems.push(format!("start after the crash: {e}")),
            }
            if let Some(id) = &run_id {
                status = self.drive(&rt, &sim, id, &mut report).await;
            }
            report.events = rt.events();
            rt.shutdown().await;
        } else {
            report.events = rt.events();
            rt.shutdown().await;
        }
        report.final_state = status;
        if report.final_state.is_none() {
            report
                .problems
                .push(format!("did not finish within {} s of virtual time", self.time_limit.as_secs()));
        }
        self.count_upstream(&mut report, baseline);
        if let Some(baseline) = baseline
            && report.final_state.is_some()
            && !self.same_end(&report.final_state, &baseline.final_state)
        {
            report.problems.push(format!(
                "ended as {:?}, the uninterrupted run as {:?}",
                report.final_state, baseline.final_state
            ));
        }
        if !report.liveness_violations.is_empty() {
            report.problems.push(format!("left behind: {:?}", report.liveness_violations));
        }
        (report, writes)
    }

    /// Whether a case ended as the baseline did: the same state, and an output that matches.
    fn same_end(&self, case: &Option<RunStatus>, baseline: &Option<RunStatus>) -> bool {
        match (case, baseline, &self.output_matches) {
            (
                Some(RunStatus::Completed { output_json: a }),
                Some(RunStatus::Completed { output_json: b }),
                Some(same),
            ) => match (serde_json::from_str::<Value>(a), serde_json::from_str::<Value>(b)) {
                (Ok(a), Ok(b)) => same(&b, &a),
                _ => false,
            },
            _ => case == baseline,
        }
    }

    /// Advances virtual time, deciding approvals, until the run ends, the store crashes or
    /// the time limit passes.
    async fn drive(
        &self,
        rt: &Runtime,
        sim: &SimBackend,
        run_id: &str,
        report: &mut CaseReport,
    ) -> Option<RunStatus> {
        let step = Duration::from_secs(1);
        let steps = self.time_limit.as_secs().max(1);
        for i in 0..=steps {
            // Settle first, so the liveness rule sees the run at rest, not mid-activation.
            let _ = rt.advance(if i == 0 { Duration::ZERO } else { step }).await;
            if sim.is_crashed() {
                return None;
            }
            if let Ok(violations) = rt.check_liveness()
                && !sim.is_crashed()
            {
                report
                    .liveness_violations
                    .extend(violations.iter().map(|v| format!("{} ({})", v.run_id, v.status.name())));
            }
            match rt.status(run_id) {
                Ok(s) if s.is_terminal() => return Some(s),
                Ok(RunStatus::WaitingApproval { .. }) => {
                    if let Some(decide) = &self.approver
                        && let Ok(pending) = rt.pending_approvals(Some(run_id))
                    {
                        for p in pending {
                            let _ = rt.approve(run_id, &p.approval_id, &p.payload_hash, decide(&p)).await;
                        }
                    }
                }
                _ => {}
            }
        }
        rt.status(run_id).ok().filter(RunStatus::is_terminal)
    }

    fn count_upstream(&self, report: &mut CaseReport, baseline: Option<&CaseReport>) {
        let Some(upstream) = &self.upstream else { return };
        for (collection, key, body) in upstream.objects() {
            *report.upstream.entry(key).or_default() += 1;
            report.requests.push((collection, body));
        }
        let Some(baseline) = baseline else { return };
        let count = |requests: &[(String, Value)]| {
            let mut n: BTreeMap<(String, String), (usize, Value)> = BTreeMap::new();
            for (collection, body) in requests {
                n.entry((collection.clone(), body.to_string())).or_insert((0, body.clone())).0 += 1;
            }
            n
        };
        let (got, want) = (count(&report.requests), count(&baseline.requests));
        for ((collection, text), (n, body)) in &got {
            let expected = want.get(&(collection.clone(), text.clone())).map_or(0, |w| w.0);
            for _ in expected..*n {
                report.duplicated_effects.push((collection.clone(), body.clone()));
            }
        }
        for ((collection, text), (n, body)) in &want {
            let made = got.get(&(collection.clone(), text.clone())).map_or(0, |g| g.0);
            for _ in made..*n {
                report.missing_effects.push((collection.clone(), body.clone()));
            }
        }
        for (collection, body) in &report.duplicated_effects {
            report.problems.push(format!("effect on {collection} made again: {body}"));
        }
        if report.final_state.is_some() {
            for (collection, body) in &report.missing_effects {
                report.problems.push(format!("effect on {collection} missing: {body}"));
            }
        }
    }
}
