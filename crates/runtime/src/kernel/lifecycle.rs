//! A runtime's own life: the work it spawned, whether it is shutting down or closed, the
//! activations under way, and the work in progress virtual time waits for.

use std::{
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use durafiber_store::lock::Mutex;

use crate::{
    clock::Stopwatch,
    error::RuntimeError,
    kernel::busy::{BusyGuard, Parked, Tally, WakeToken},
};

pub(crate) struct Lifecycle {
    /// Work started by the supervisor or scheduler, awaited by `settle`.
    pub tracked: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    pub shutting_down: AtomicBool,
    /// Activations past their shutdown check and not yet registered: `shutdown` waits for
    /// them, so that its stop of every registered run misses none ([`Activating`]).
    pub activating: AtomicU64,
    /// Set when `shutdown` has finished: a task of this runtime still in flight (a timer that
    /// fires later, an aborted fiber between two polls) writes nothing after it.
    pub closed: AtomicBool,
    /// Work in progress that virtual time must wait for: fibers not parked on the clock or
    /// a human, and events on their way to an actor.
    pub busy: Arc<Tally>,
    /// Events handed to parked fibers that have not resumed yet (see [`WakeToken`]).
    pub woken: Arc<Tally>,
    /// An inspection handle (the command line on a bare data directory): it reads and
    /// records decisions but never runs agent code; the next serving runtime does.
    pub passive: bool,
    /// When the runtime opened: the recovery latency of runs found by the start-up scan.
    pub opened: Stopwatch,
}

impl Lifecycle {
    pub fn new(passive: bool) -> Self {
        Lifecycle {
            tracked: Mutex::new(Vec::new()),
            shutting_down: AtomicBool::new(false),
            activating: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            busy: Arc::default(),
            woken: Arc::default(),
            passive,
            opened: Stopwatch::start(),
        }
    }

    pub fn wake_token(&self) -> WakeToken {
        WakeToken::count(&self.woken)
    }

    pub fn busy(&self) -> BusyGuard {
        BusyGuard::count(&self.busy)
    }

    /// Awaits `fut` as parked work: waiting on the clock or a human is not work in progress,
    /// so virtual time may move meanwhile. Only the fiber's own waits are parked.
    pub async fn parked<F: Future>(&self, in_fiber: bool, fut: F) -> F::Output {
        if !in_fiber {
            return fut.await;
        }
        Parked::new(fut, &self.busy).await
    }

    /// Whether `shutdown` has finished: nothing is written after it.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Counts an activation under way, unless the runtime is shutting down. The count comes
    /// before the check: `shutdown` sets its flag before it reads the count, so either it
    /// sees this activation counted or this activation sees the flag.
    pub fn activating(&self) -> Result<Activating<'_>, RuntimeError> {
        self.activating.fetch_add(1, Ordering::SeqCst);
        let guard = Activating { count: &self.activating };
        if self.shutting_down.load(Ordering::SeqCst) {
            return Err(RuntimeError::ShuttingDown);
        }
        Ok(guard)
    }

    /// Spawns work that `settle` waits for.
    pub fn spawn_tracked<F: Future<Output = ()> + Send + 'static>(&self, fut: F) {
        let handle = tokio::spawn(fut);
        let mut tracked = self.tracked.lock();
        tracked.retain(|h| !h.is_finished());
        tracked.push(handle);
    }
}

/// An activation under way (see [`Lifecycle::activating`]); uncounted when dropped.
pub(crate) struct Activating<'a> {
    count: &'a AtomicU64,
}

impl Drop for Activating<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::SeqCst);
    }
}
