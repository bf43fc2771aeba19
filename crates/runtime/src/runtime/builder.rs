//! Building and opening a runtime: `Runtime::builder(store)` registers agent kinds and
//! settings; `open` builds the shared state, scans for interrupted runs and re-activates them
//! without waiting for a request, and starts the driver on the system clock.

use durafiber_store::lock::Mutex;
use std::{collections::HashMap, marker::PhantomData, sync::Arc};

use durafiber_store::Store;

use crate::{
    agent::Agent,
    clock::{Clock, SystemClock, Time, VirtualClock},
    config::RuntimeConfig,
    error::RuntimeError,
    events::EventLog,
    kernel::activity::Liveness,
    kernel::alarm_window::Scheduler,
    kernel::controls::Controls,
    kernel::lifecycle::Lifecycle,
    kernel::observe::Observability,
    kernel::ownership::Ownership,
    kernel::registry::Registry,
    kernel::shared::Agents,
    kernel::shared::{CrashHook, ErasedAgent, Shared},
    kernel::signals::Signals,
    kernel::stripes::Stripes,
    kernel::timers::Timers,
    metrics::Metrics,
    run::actor::reactivate_boxed,
    run::driver::drive_system_clock,
    run::leases,
    run::rescan,
    secret::Secrets,
    typed::Typed,
};

use super::handle::Runtime;

impl Runtime {
    /// Starts building a runtime over `store`, on the system clock, with default settings.
    pub fn builder(store: Store) -> RuntimeBuilder {
        RuntimeBuilder {
            store,
            clock: Arc::new(SystemClock),
            virtual_clock: None,
            config: RuntimeConfig::default(),
            kinds: HashMap::new(),
            secrets: Secrets::default(),
            crash_hook: None,
            passive: false,
            advertise: String::new(),
        }
    }
}

/// Sets up a runtime: its store, clock, configuration, secrets and agent kinds.
pub struct RuntimeBuilder {
    pub(super) store: Store,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) virtual_clock: Option<VirtualClock>,
    pub(super) config: RuntimeConfig,
    pub(super) kinds: HashMap<String, Arc<dyn ErasedAgent>>,
    pub(super) secrets: Secrets,
    pub(super) crash_hook: Option<CrashHook>,
    pub(super) passive: bool,
    pub(super) advertise: String,
}

impl RuntimeBuilder {
    /// Opens for inspection only: no recovery scan, no driver, no agent code runs. Reads,
    /// decisions and cancellations are durable and picked up by the next serving runtime.
    pub fn passive(mut self) -> Self {
        self.passive = true;
        self
    }

    /// Where this node serves HTTP, told to the other nodes of a shared store so that they
    /// can send it requests for the runs it owns (`host:port`).
    pub fn advertise(mut self, addr: impl Into<String>) -> Self {
        self.advertise = addr.into();
        self
    }

    /// Registers an agent kind under `A::KIND`.
    pub fn agent<A: Agent>(mut self, agent: A) -> Self {
        self.kinds.insert(A::KIND.to_string(), Arc::new(Typed::<A>(Arc::new(agent), PhantomData)));
        self
    }

    /// Replaces the default configuration.
    pub fn config(mut self, config: RuntimeConfig) -> Self {
        self.config = config;
        self
    }

    /// Runs on `clock` instead of the system clock (a clock kept by other means, or one set
    /// off on purpose to test what a node with a wrong clock does). On a store several nodes
    /// share, the runtime still keeps its times on the database's clock, measuring how far
    /// this one is from it.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self.virtual_clock = None;
        self
    }

    /// Runs on a virtual clock that moves only through [`Runtime::advance`].
    pub fn virtual_clock(mut self, clock: VirtualClock) -> Self {
        self.clock = Arc::new(clock.clone());
        self.virtual_clock = Some(clock);
        self
    }

    /// Where `Secret` pointers are resolved.
    pub fn secrets(mut self, secrets: Secrets) -> Self {
        self.secrets = secrets;
        self
    }

    /// Opens the runtime: loads the alarm window, re-activates interrupted runs, starts the
    /// driver (system clock only).
    pub async fn open(self) -> Result<Runtime, RuntimeError> {
        let (virtual_clock, advertise, passive) =
            (self.virtual_clock.clone(), self.advertise.clone(), self.passive);
        let shared = Arc::new(self.services()?);
        let shared_store = shared.store.backend().leases().is_some();
        if passive {
            return Ok(Runtime { shared, virtual_clock, driver: Arc::new(Mutex::new(None)) });
        }
        // On a shared store: the shards first, so the alarms read and the runs recovered are
        // this node's.
        leases::join(&shared, &advertise).await?;
        shared.refill_alarms()?;
        let interrupted = rescan::scan_and_reactivate(&shared).await?;
        if shared_store {
            tokio::spawn(leases::hold(shared.clone(), advertise));
        }
        tracing::info!(interrupted, "runtime open");
        let driver = match virtual_clock {
            Some(_) => None,
            None => Some(tokio::spawn(drive_system_clock(shared.clone()))),
        };
        Ok(Runtime { shared, virtual_clock, driver: Arc::new(Mutex::new(driver)) })
    }

    /// The runtime's services, made from what was built: the store, its time, the agents, the
    /// alarm window, the pauses as stored, spans, the named limits.
    fn services(self) -> Result<Shared, RuntimeError> {
        self.config.validate()?;
        // The runtime's setting holds whoever opened the store.
        self.store.set_flush_every(self.config.flush_every);
        let seed = self.config.seed;
        let scheduler = Scheduler::with_capacity(self.config.alarm_window);
        let pauses = crate::kernel::pauses::Pauses::load(&self.store)?;
        let shared_store = self.store.backend().leases().is_some();
        // Nodes of a shared store keep their times on the database's clock.
        let time = Time::new(self.clock, shared_store && self.virtual_clock.is_none());
        let retention_on = self.config.retention.is_on() && !self.passive;
        // An inspection handle runs no agent code: it has no spans to send.
        let traces = match self.passive {
            true => crate::trace::Traces::off(),
            false => {
                let node = self.store.backend().leases().map(|l| l.node_id().to_string());
                crate::trace::Traces::open(&self.config.traces, node.as_deref().unwrap_or("local"))?
            }
        };
        let node = self.store.backend().leases().map(|l| l.node_id().to_string());
        let limiters = crate::kernel::limiters::Limiters::new(
            &self.config.limits,
            node.as_deref().unwrap_or("local"),
            time.now(),
        );
        Ok(Shared {
            agents: Agents {
                kinds: self.kinds,
                reactivator: reactivate_boxed,
                starter: crate::run::start::start_boxed,
                evictor: crate::eviction::idle::evict_boxed,
            },
            store: self.store,
            time,
            liveness: Liveness::new(&self.config),
            config: self.config,
            registry: Registry::default(),
            timers: Timers::new(scheduler, retention_on),
            obs: Observability {
                metrics: Metrics::default(),
                events: EventLog::default(),
                traces,
                secrets: self.secrets,
                crash_hook: self.crash_hook,
            },
            signals: Signals::new(),
            life: Lifecycle::new(self.passive),
            stripes: Stripes::new(),
            controls: Controls::new(limiters, pauses, seed),
            ownership: match (self.passive, shared_store) {
                (false, true) => Ownership::nothing(),
                _ => Ownership::everything(),
            },
        })
    }
}
