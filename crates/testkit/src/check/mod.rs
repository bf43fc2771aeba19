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
//! - **storage durable at once** ([`AgentCheck::storage_durable_at_once`]): every store
//!   write lost in turn, as above, with each storage write durable on its own (PostgreSQL).
//! - **an event before its wait**, for each event given with [`AgentCheck::send_event`]: sent
//!   right after the start instead of while the run waits for it, so it is buffered.
//!
//! A case's end is compared with the baseline's whole: its state and output, its output
//! stream chunk for chunk, its storage key for key, and the upstream's objects. The verdict
//! does not depend on the machine's speed: virtual time moves only when every fiber waits on
//! it, so an effect's real I/O finishes (or times out on the real clock) first.
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

mod fork;
mod play;
mod report;
mod upstream;

pub use report::{CaseReport, CheckReport, CrashPoint};
pub use upstream::{CheckUpstream, UpstreamFuture};

use std::{collections::BTreeMap, ops::Range, sync::Arc, time::Duration};

use durafiber_runtime::{
    Agent, Boundary, CrashHook, Decider, Decision, PendingApproval, RunOptions, Runtime, RuntimeConfig,
    Timestamp, clock::VirtualClock, testing::BuilderTestExt,
};
use durafiber_store::{SimBackend, Store, StoreConfig};
use parking_lot::Mutex;
use serde_json::Value;

/// Why a case could not be played to its end: the checker's own trouble (a store that does
/// not open, a run that does not start), reported among the case's problems.
#[derive(Debug, PartialEq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Unplayable(String);

impl From<Unplayable> for String {
    fn from(why: Unplayable) -> String {
        why.0
    }
}

impl From<String> for Unplayable {
    fn from(why: String) -> Self {
        Unplayable(why)
    }
}

impl From<&str> for Unplayable {
    fn from(why: &str) -> Self {
        Unplayable(why.to_string())
    }
}

type Approver = Arc<dyn Fn(&PendingApproval) -> Decision + Send + Sync>;
type OutputMatch = Arc<dyn Fn(&Value, &Value) -> bool + Send + Sync>;
type StorageMatch = Arc<dyn Fn(&BTreeMap<String, Value>, &BTreeMap<String, Value>) -> bool + Send + Sync>;

/// A crash and eviction check of one agent's run; see the [module](self) documentation.
pub struct AgentCheck<A: Agent + Clone> {
    agent: A,
    input: Option<Value>,
    crashes: bool,
    storage_at_once: bool,
    effect_kills: bool,
    evictions: bool,
    seeds: Range<u64>,
    approver: Option<Approver>,
    deciders: Vec<String>,
    forks: bool,
    upstream: Option<Arc<dyn CheckUpstream>>,
    time_limit: Duration,
    config: RuntimeConfig,
    options: RunOptions,
    events: BTreeMap<String, Value>,
    output_matches: Option<OutputMatch>,
    storage_matches: Option<StorageMatch>,
    /// More agent kinds the runtime runs: the checked agent's children.
    more_agents: Vec<Register>,
    /// The next deploy of the checked agent, for `deploy_at_every_boundary`.
    deploy: Option<Register>,
}

type Register =
    Arc<dyn Fn(durafiber_runtime::RuntimeBuilder) -> durafiber_runtime::RuntimeBuilder + Send + Sync>;

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
    /// Send the events right after the start, before the run waits for them.
    events_early: bool,
    /// After the crash, the process that opens the disk runs the next deploy's code.
    deploy: bool,
    /// And that process is killed at its first boundary, once.
    crash_after_deploy: bool,
    /// Each storage write is durable on its own, as on PostgreSQL.
    storage_at_once: bool,
}

/// What a dry run saw.
struct Dry {
    report: CaseReport,
    boundaries: Vec<Boundary>,
    writes: u64,
}

impl<A: Agent + Clone> AgentCheck<A> {
    /// A check of `agent`; give it an input, then choose the cases.
    pub fn new(agent: A) -> Self {
        AgentCheck {
            agent,
            input: None,
            crashes: false,
            storage_at_once: false,
            effect_kills: false,
            evictions: false,
            seeds: 1..4,
            approver: None,
            deciders: Vec::new(),
            forks: false,
            upstream: None,
            time_limit: Duration::from_secs(3600),
            config: RuntimeConfig::default(),
            options: RunOptions::default(),
            events: BTreeMap::new(),
            output_matches: None,
            storage_matches: None,
            more_agents: Vec::new(),
            deploy: None,
        }
    }

    /// Registers another agent kind beside the checked one — the kind of the children it
    /// starts (`Ctx::start_child`): they run, crash and recover in the same runtime.
    pub fn with_agent<B: Agent + Clone>(mut self, agent: B) -> Self {
        self.more_agents.push(Arc::new(move |builder| builder.agent(agent.clone())));
        self
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

    /// Also lose every store write in turn with each storage write durable on its own, as on
    /// PostgreSQL: a re-entry at a stash then finds what the fiber wrote after it, and an
    /// agent that counts on its storage going back with the stash is caught.
    pub fn storage_durable_at_once(mut self) -> Self {
        self.storage_at_once = true;
        self
    }

    /// Crash between each effect's call and its receipt's commit.
    pub fn kill_during_effects(mut self) -> Self {
        self.effect_kills = true;
        self
    }

    /// Play the run to its end, then fork it from each boundary of its history in turn
    /// (`Runtime::fork`): each fork must end as the run did, call the upstream with none of
    /// the keys it inherited, make objects only under its own keys, and leave the run it
    /// came from unchanged.
    pub fn fork_at_every_boundary(mut self) -> Self {
        self.forks = true;
        self
    }

    /// Deploy `next` — the checked agent's next version, of the same kind — at every
    /// boundary: the run is crashed right after each boundary its dry run passes, and the
    /// process that opens the disk runs `next`'s code; then once more with that process
    /// killed at its own first boundary (an upgraded stash's write). Each case must end in
    /// the state the uninterrupted run did — nothing escalated — with no effect made twice.
    /// Its output and stream may differ after the deploy point: the new code's, not a
    /// replay's. Chunks the new code re-emits otherwise are kept as they were (not compared
    /// strictly, as they are between attempts of one build).
    pub fn deploy_at_every_boundary<B: Agent + Clone>(mut self, next: B) -> Self {
        self.deploy = Some(Arc::new(move |builder| builder.agent(next.clone())));
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

    /// Who decides a pause that takes more than one person (`request_approval_with`), in
    /// turn, one decision per step of virtual time (default `reviewer-1`, `reviewer-2`, …,
    /// each holding the role `reviewer`).
    pub fn deciders(mut self, names: &[&str]) -> Self {
        self.deciders = names.iter().map(|n| (*n).to_string()).collect();
        self
    }

    /// The next person to decide `pending`: the first of the deciders who has not.
    pub(super) fn decider_after(&self, pending: &PendingApproval) -> Decider {
        let voted = |name: &str| pending.votes.iter().any(|v| v.by == name);
        let name = match self.deciders.iter().find(|n| !voted(n)) {
            Some(name) => name.clone(),
            None => (1..).map(|n| format!("reviewer-{n}")).find(|n| !voted(n)).unwrap_or_default(),
        };
        Decider::new(name, &["reader", "reviewer"])
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

    /// How a case's storage is compared with the uninterrupted run's (default: equal), for an
    /// agent that stores its own history: `same(baseline, case)`, values as JSON.
    pub fn storage_matches(
        mut self,
        same: impl Fn(&BTreeMap<String, Value>, &BTreeMap<String, Value>) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.storage_matches = Some(Arc::new(same));
        self
    }

    /// Delivers the external event `name` with `payload` whenever the run waits for it (with
    /// one idempotency key, so a re-send after a crash is a duplicate), and adds a case that
    /// sends it right after the start, before the run waits, to check that it is buffered.
    pub fn send_event(mut self, name: &str, payload: Value) -> Self {
        self.events.insert(name.to_string(), payload);
        self
    }

    /// The options every case's run starts with: a budget, a durability mode, a keep-alive.
    pub fn options(mut self, options: RunOptions) -> Self {
        self.options = options;
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
        let mut points: Vec<CrashPoint> = dry.boundaries.iter().cloned().map(CrashPoint::At).collect();
        points.extend((1..=dry.writes).map(CrashPoint::WriteLost));
        points
    }

    /// Runs every chosen case.
    pub async fn run(&self) -> CheckReport {
        let dry = self.dry_run().await;
        let baseline = dry.report;
        let mut cases = Vec::new();
        if self.crashes || self.effect_kills {
            for (i, boundary) in dry.boundaries.iter().enumerate() {
                let wanted = match boundary {
                    Boundary::AfterEffectCall(_) => self.effect_kills || self.crashes,
                    _ => self.crashes,
                };
                let point = CrashPoint::At(boundary.clone());
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
        if self.storage_at_once {
            cases.extend(self.storage_at_once_cases(&baseline).await);
        }
        if self.deploy.is_some() {
            cases.extend(self.deploy_cases(&dry.boundaries, &baseline).await);
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
        if self.forks {
            match self.history_seqs().await {
                Ok(seqs) => {
                    for at in seqs {
                        cases.push(self.play_fork(at, &baseline).await);
                    }
                }
                Err(e) => {
                    let mut case = CaseReport::named("forks", None);
                    case.problems.push(e.into());
                    cases.push(case);
                }
            }
        }
        if !self.events.is_empty() {
            let trouble = Trouble { events_early: true, ..Trouble::default() };
            cases.push(self.case("events sent before the run waits", None, trouble, &baseline).await);
        }
        CheckReport { baseline, cases }
    }

    /// A deploy after each boundary, then the same with the new process killed at its first.
    async fn deploy_cases(&self, boundaries: &[Boundary], baseline: &CaseReport) -> Vec<CaseReport> {
        let mut cases = Vec::new();
        for (i, boundary) in boundaries.iter().enumerate() {
            for crash_after_deploy in [false, true] {
                let trouble = Trouble {
                    crash_after_boundary: Some(i + 1),
                    deploy: true,
                    crash_after_deploy,
                    ..Trouble::default()
                };
                let point = CrashPoint::At(boundary.clone());
                let killed = if crash_after_deploy { ", killed at its first boundary" } else { "" };
                let case = format!("deployed after {point} (boundary {}){killed}", i + 1);
                cases.push(self.case(&case, Some(point), trouble, baseline).await);
            }
        }
        cases
    }

    async fn dry_run(&self) -> Dry {
        let boundaries = Arc::new(Mutex::new(Vec::new()));
        let (report, writes) =
            self.play("baseline", None, Trouble::default(), None, Some(boundaries.clone())).await;
        let boundaries = boundaries.lock().clone();
        Dry { report, boundaries, writes }
    }

    /// Every store write lost in turn, each storage write durable on its own.
    async fn storage_at_once_cases(&self, baseline: &CaseReport) -> Vec<CaseReport> {
        let at_once = Trouble { storage_at_once: true, ..Trouble::default() };
        let (_, writes) = self.play("storage durable at once", None, at_once.clone(), None, None).await;
        let mut cases = Vec::new();
        for n in 1..=writes {
            let point = CrashPoint::WriteLost(n);
            let trouble = Trouble { lose_write: Some(n), ..at_once.clone() };
            let name = format!("crash {point}, each storage write durable at once");
            cases.push(self.case(&name, Some(point), trouble, baseline).await);
        }
        cases
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

    pub(super) async fn open(
        &self,
        sim: &SimBackend,
        now: Timestamp,
        config: RuntimeConfig,
        hook: Option<CrashHook>,
    ) -> Result<Runtime, Unplayable> {
        // Within one build a fiber re-entered must emit again what it emitted: a different
        // chunk is a determinism bug the author wants to see, not a deploy to ride out.
        self.reopen(sim, now, RuntimeConfig { strict_streams: true, ..config }, hook, false).await
    }

    /// Opens a runtime on the simulated disk with the checked agent's code, or with the
    /// next deploy's (`deployed`), under `config` as given.
    pub(super) async fn reopen(
        &self,
        sim: &SimBackend,
        now: Timestamp,
        config: RuntimeConfig,
        hook: Option<CrashHook>,
        deployed: bool,
    ) -> Result<Runtime, Unplayable> {
        let store = Store::with_backend(Arc::new(sim.clone()), StoreConfig::default())
            .map_err(|e| format!("the simulated store does not open: {e}"))?;
        let mut builder = Runtime::builder(store).config(config).virtual_clock(VirtualClock::new(now));
        builder = match (&self.deploy, deployed) {
            (Some(register), true) => register(builder),
            _ => builder.agent(self.agent.clone()),
        };
        for register in &self.more_agents {
            builder = register(builder);
        }
        if let Some(hook) = hook {
            builder = builder.crash_hook(hook);
        }
        Ok(builder.open().await.map_err(|e| format!("the runtime does not open: {e}"))?)
    }
}
