//! Work in progress, counted so that virtual time moves only when everything is parked on
//! the clock or a human: a guard per piece of work, a token per event handed to a parked
//! fiber, and the parked wait itself.

use std::{
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering::SeqCst},
    },
};

use tokio::sync::Notify;

/// A count of work in progress that can be awaited down to zero. Every fiber start and
/// park changes it, so a change is one atomic operation, and only a change to zero wakes
/// the waiters (`Runtime::settle`); a `watch` channel took a lock and woke eight notifiers
/// on every change, 3% of the CPU of a 100,000-run recovery.
#[derive(Default)]
pub(crate) struct Tally {
    n: AtomicU64,
    zero: Notify,
}

impl Tally {
    pub fn get(&self) -> u64 {
        self.n.load(SeqCst)
    }

    fn up(&self) {
        self.n.fetch_add(1, SeqCst);
    }

    /// Never below zero: a count that would go negative stays at zero.
    fn down(&self) {
        if self.n.fetch_update(SeqCst, SeqCst, |n| Some(n.saturating_sub(1))) == Ok(1) {
            self.zero.notify_waiters();
        }
    }

    /// Completes once the count is zero.
    pub async fn zero(&self) {
        loop {
            let notified = self.zero.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the count is read, so a fall to zero after the read wakes it.
            notified.as_mut().enable();
            if self.get() == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// Counts an event handed to a parked fiber that has not resumed yet. The fiber drops it
/// after it counts itself busy again; a fiber dropped instead (eviction) drops it with the
/// undelivered message. Either way the count balances.
pub(crate) struct WakeToken {
    woken: Arc<Tally>,
}

impl WakeToken {
    /// Counts one more event on its way to a parked fiber.
    pub fn count(woken: &Arc<Tally>) -> Self {
        woken.up();
        WakeToken { woken: woken.clone() }
    }
}

impl Drop for WakeToken {
    fn drop(&mut self) {
        self.woken.down();
    }
}

/// A parked wait. When it completes it counts the fiber busy again *before* dropping the
/// inner future (a virtual sleeper stops counting as woken on drop); when it is dropped
/// unfinished (eviction) it counts the fiber busy again so the fiber's own guard balances.
/// It stops counting the fiber busy only once its future is pending: a wait that is ready at
/// once (an effect's answer inside a deadline, say) never shows virtual time a quiet moment.
pub(crate) struct Parked<F: Future> {
    inner: Option<std::pin::Pin<Box<F>>>,
    busy: Arc<Tally>,
    /// Whether the fiber is counted parked (not busy) now.
    parked: bool,
}

impl<F: Future> Future for Parked<F> {
    type Output = F::Output;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let Some(inner) = self.inner.as_mut() else { return std::task::Poll::Pending };
        match inner.as_mut().poll(cx) {
            std::task::Poll::Ready(out) => {
                if self.parked {
                    self.busy.up();
                    self.parked = false;
                }
                self.inner = None;
                std::task::Poll::Ready(out)
            }
            std::task::Poll::Pending => {
                if !self.parked {
                    self.busy.down();
                    self.parked = true;
                }
                std::task::Poll::Pending
            }
        }
    }
}

impl<F: Future> Drop for Parked<F> {
    fn drop(&mut self) {
        if self.parked {
            self.busy.up();
        }
    }
}

/// Counts one piece of work in progress for as long as it lives.
pub(crate) struct BusyGuard {
    busy: Arc<Tally>,
}

impl BusyGuard {
    /// Counts one more piece of work.
    pub fn count(busy: &Arc<Tally>) -> Self {
        busy.up();
        BusyGuard { busy: busy.clone() }
    }
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.busy.down();
    }
}

impl<F: Future> Parked<F> {
    /// Awaits `fut` as parked work: the caller stops counting as busy until it completes.
    pub fn new(fut: F, busy: &Arc<Tally>) -> Self {
        Parked { inner: Some(Box::pin(fut)), busy: busy.clone(), parked: false }
    }
}
