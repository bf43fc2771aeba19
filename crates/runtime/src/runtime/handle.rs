//! The runtime's handle: started runs, and its life on the clock (`builder.rs` opens it).
//!
//! On the system clock
//! a driver task wakes at the next deadline (hibernation, eviction, heartbeat, recovery
//! backoff, alarm); on a virtual clock, `advance` walks the same deadlines in order.

use durafiber_api::Timestamp;
use durafiber_store::lock::Mutex;
use durafiber_store::{RunId, tables::RunStatus};
use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use durafiber_store::Store;

use crate::{
    agent::Agent,
    clock::{Clock, VirtualClock},
    config::RuntimeConfig,
    error::{LivenessViolation, RuntimeError},
    events::Event,
    eviction::idle,
    kernel::shared::Shared,
    metrics::MetricsSnapshot,
    run::driver::{next_deadline, tick},
    run::leases,
    run::liveness,
    run::start::{StartOutcome, StartRequest},
};

/// Where a run is run ([`Runtime::owner_of`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunOwner {
    /// This runtime.
    Here,
    /// Another node of the shared store.
    Node {
        /// The node's id.
        node_id: String,
        /// Where it serves HTTP, if it said.
        http_addr: Option<String>,
        /// The run's shard.
        shard: u32,
    },
    /// No node holds the shard's lease now (its owner died, or this node's lease is in
    /// doubt): one will within a third of the lease.
    Nobody {
        /// The run's shard.
        shard: u32,
    },
}

/// A durable runtime. Cheap to clone; every clone is the same runtime.
#[derive(Clone)]
pub struct Runtime {
    pub(super) shared: Arc<Shared>,
    pub(super) virtual_clock: Option<VirtualClock>,
    pub(super) driver: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
}

impl Runtime {
    /// The store underneath.
    pub fn store(&self) -> &Store {
        &self.shared.store
    }

    /// The configuration in force.
    pub fn config(&self) -> &RuntimeConfig {
        &self.shared.config
    }

    /// The clock's time.
    pub fn now(&self) -> Timestamp {
        self.shared.now()
    }

    /// Starts a run of agent `A` (§2): durable before anything runs; the same key and input
    /// return the same handle; the same key with another input is `KeyConflict`.
    /// [`Runtime::start_run`] takes options, an untyped kind and input, a caller's trace.
    pub async fn start<A: Agent>(&self, key: &str, input: &A::Input) -> Result<StartOutcome, RuntimeError> {
        self.start_run(StartRequest::of::<A>(key, input)?).await
    }

    /// Waits until run `run_id` of agent `A` ends: its output, typed, when it completed;
    /// otherwise how it ended (failed, cancelled, escalated) as the inner error. The outer
    /// error is the wait's own (an unknown run, a runtime shutting down, an output that is
    /// not `A::Output`).
    ///
    /// ```no_run
    /// # use durafiber_runtime::{Agent, AgentError, Ctx, Runtime};
    /// # struct Adder;
    /// # impl Agent for Adder {
    /// #     const KIND: &'static str = "adder";
    /// #     type Input = (u32, u32);
    /// #     type Stash = ();
    /// #     type Output = u32;
    /// #     type Message = ();
    /// #     async fn run_fiber(&self, _: &mut Ctx<Self>, (a, b): (u32, u32)) -> Result<u32, AgentError> { Ok(a + b) }
    /// # }
    /// # async fn demo(rt: Runtime) -> Result<(), Box<dyn std::error::Error>> {
    /// let run = rt.start::<Adder>("sum-1", &(2, 3)).await?.run_id;
    /// let sum: u32 = rt.wait_output::<Adder>(&run).await?.map_err(|ended| format!("{ended:?}"))?;
    /// assert_eq!(sum, 5);
    /// # Ok(()) }
    /// ```
    pub async fn wait_output<A: Agent>(
        &self,
        run_id: &RunId,
    ) -> Result<Result<A::Output, RunStatus>, RuntimeError> {
        match self.wait(run_id).await? {
            RunStatus::Completed { output_json } => crate::json::parse(&output_json).map(Ok).map_err(|e| {
                RuntimeError::InvalidInput(format!("the output of {run_id} is not {}'s: {e}", A::KIND))
            }),
            ended => Ok(Err(ended)),
        }
    }

    /// Starts the run `request` asks for: durable before anything runs, then activated
    /// beside the caller. The same key and input return the same handle; the same key with
    /// another input is `KeyConflict`.
    pub async fn start_run(&self, request: StartRequest<'_>) -> Result<StartOutcome, RuntimeError> {
        crate::run::start::start(&self.shared, request).await
    }

    /// Forks run `run_id` from boundary `at` of its history (a stash's `seq`,
    /// [`Runtime::history`]): a new run of the same kind under idempotency key `key`, started
    /// from that stash with the source's input or `options.input_json`. Effects the source
    /// committed before `at` are inherited — their receipts returned, nothing called again —
    /// as are approvals it had decided, sleeps it had woken from and event waits it had ended;
    /// later ones get new keys or are asked again. The source is not touched. The same key
    /// again returns the same fork. See `run/fork.rs` for what is refused (`ForkRefused`).
    pub async fn fork(
        &self,
        run_id: &RunId,
        at: u64,
        key: &str,
        options: crate::run::fork::ForkOptions,
    ) -> Result<StartOutcome, RuntimeError> {
        let outcome = crate::run::fork::fork(&self.shared, run_id, at, key, options).await?;
        crate::run::start::announce_if_elsewhere(&self.shared, &outcome);
        Ok(outcome)
    }

    /// Hibernates a run now, if it is hibernateable.
    pub async fn hibernate(&self, run_id: &RunId) {
        idle::hibernate(&self.shared, run_id).await;
    }

    /// Evicts a run now, wherever it is.
    pub async fn evict(&self, run_id: &RunId) {
        idle::evict(&self.shared, run_id, "forced").await;
    }

    /// Whether the run is live in this process (in memory, not hibernated or evicted).
    pub async fn is_live(&self, run_id: &RunId) -> bool {
        self.shared.registry.get(run_id).is_some()
    }

    /// Number of runs live in this process.
    pub async fn live_count(&self) -> usize {
        self.shared.registry.len()
    }

    /// Counters and histograms.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.shared.obs.metrics.snapshot()
    }

    /// The in-memory event log, oldest first.
    pub fn events(&self) -> Vec<Event> {
        self.shared.obs.events.snapshot()
    }

    /// The events after `after_seq` (0: from the oldest kept), of one run or all, at most
    /// `limit`, oldest first: how a live view follows the log.
    pub fn events_since(&self, after_seq: u64, run_id: Option<&RunId>, limit: usize) -> Vec<Event> {
        self.shared.obs.events.since(after_seq, run_id.map(RunId::as_str), limit)
    }

    /// Waits until the runtime is quiet: the work the supervisor and scheduler started is
    /// done, and every fiber is parked (on the clock, a human, or cancellation) or finished.
    /// On a virtual clock, a fiber must wait only through its `Ctx`, or this waits for it.
    pub async fn settle(&self) {
        loop {
            if let Some(clock) = &self.virtual_clock {
                clock.woken_resumed().await;
            }
            self.shared.life.woken.zero().await;
            let handles: Vec<_> = std::mem::take(&mut *self.shared.life.tracked.lock());
            for h in handles {
                let _ = h.await;
            }
            self.shared.life.busy.zero().await;
            tokio::task::yield_now().await;
            let quiet = self.shared.life.busy.get() == 0 && self.shared.life.tracked.lock().is_empty();
            if quiet {
                return;
            }
        }
    }

    /// Moves the virtual clock forward by `d`, handling every deadline on the way in order.
    pub async fn advance(&self, d: Duration) -> Result<(), RuntimeError> {
        let clock = self.virtual_clock.as_ref().ok_or(RuntimeError::NotVirtual)?;
        let target = clock.now().saturating_add(d);
        self.settle().await;
        // Bounded: each step handles at least one deadline, and deadlines are finite.
        for _ in 0..1_000_000 {
            let runtime_next = next_deadline(&self.shared).filter(|at| *at > clock.now());
            let due_now = next_deadline(&self.shared).is_some_and(|at| at <= clock.now());
            if due_now {
                tick(&self.shared).await;
                self.settle().await;
                continue;
            }
            let next = [runtime_next, clock.next_wake()].into_iter().flatten().min();
            match next {
                Some(at) if at <= target => {
                    clock.set(at);
                    tick(&self.shared).await;
                    self.settle().await;
                }
                _ => break,
            }
        }
        clock.set(target);
        tick(&self.shared).await;
        self.settle().await;
        let violations = self.check_liveness()?;
        if !violations.is_empty() {
            return Err(RuntimeError::LivenessViolation { violations });
        }
        Ok(())
    }

    /// This node's id, on a store several nodes share.
    pub fn node_id(&self) -> Option<String> {
        self.shared.store.backend().leases().map(|l| l.node_id().to_string())
    }

    /// The shards this node owns now, on a store several nodes share (empty alone: it
    /// owns every run).
    pub fn owned_shards(&self) -> Vec<u32> {
        self.shared.ownership.shards()
    }

    /// Which node runs `run_id`: this one (always, alone on its store), or the node that
    /// holds its shard's lease on a shared store, with the address it serves HTTP at.
    pub fn owner_of(&self, run_id: &RunId) -> Result<RunOwner, RuntimeError> {
        if self.shared.ownership.owns(run_id) {
            return Ok(RunOwner::Here);
        }
        let Some(leases) = self.shared.store.backend().leases() else { return Ok(RunOwner::Here) };
        let shard = durafiber_store::shard::of_run(run_id);
        let owner = leases.owners()?.into_iter().find(|o| o.shard == shard);
        Ok(match owner {
            Some(o) if o.node_id == leases.node_id() => RunOwner::Nobody { shard },
            Some(o) => RunOwner::Node { node_id: o.node_id, http_addr: o.http_addr, shard },
            None => RunOwner::Nobody { shard },
        })
    }

    /// Takes over the shard of `run_id` if no node holds it (a shared store), so that this
    /// node serves the run now. True when this node owns the run afterwards.
    pub async fn take_over(&self, run_id: &RunId) -> bool {
        leases::take_over(&self.shared, durafiber_store::shard::of_run(run_id)).await
    }

    /// Every open run that breaks the liveness rule (§3.7): neither live with a fiber, nor
    /// parked on a durable wait (an approval, an alarm), nor holding a wake at a known time.
    /// Cheap: one pass over the open runs. On a virtual clock, [`Runtime::advance`] checks it
    /// after every call and fails with [`RuntimeError::LivenessViolation`].
    pub fn check_liveness(&self) -> Result<Vec<LivenessViolation>, RuntimeError> {
        liveness::check(&self.shared)
    }

    /// Stops the driver and every actor, then makes the store durable. Runs stay as stored:
    /// a run that was executing is recovered by the next runtime, as after a deploy.
    pub async fn shutdown(&self) {
        self.shared.life.shutting_down.store(true, Ordering::SeqCst);
        self.shared.timers.driver_wake.notify_one();
        if let Some(driver) = self.driver.lock().take() {
            driver.abort();
        }
        // An activation under way (beside a start, say) registers its run in a moment; the
        // stop below must not miss it, or its actor and fiber would outlive the runtime.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while self.shared.life.activating.load(Ordering::SeqCst) > 0 && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        for run_id in self.shared.registry.run_ids() {
            if let Some(live) = self.shared.registry.remove(&run_id) {
                if let Some(fiber) = live.cell.task.fiber.lock().take() {
                    fiber.abort();
                }
                if let Some(actor) = live.mailbox().close().await {
                    let _ = actor.kill_and_wait(None).await;
                }
                // A deploy is an interruption the runtime chose: a recovery it cut short is
                // not a failed one (§3.6).
                idle::give_back_recovery(&self.shared, &live.cell, None).await;
            }
        }
        let _ = self.shared.store.barrier().await;
        // Every run is stopped and written: other nodes may take the shards at once.
        leases::release_all(&self.shared).await;
        self.shared.life.closed.store(true, Ordering::SeqCst);
        self.shared.obs.traces.flush().await;
    }
}
