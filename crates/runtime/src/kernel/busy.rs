//! Work in progress, counted so that virtual time moves only when everything is parked on
//! the clock or a human: a guard per piece of work, a token per event handed to a parked
//! fiber, and the parked wait itself.

use std::future::Future;

use tokio::sync::watch;

/// Counts an event handed to a parked fiber that has not resumed yet. The fiber drops it
/// after it counts itself busy again; a fiber dropped instead (eviction) drops it with the
/// undelivered message. Either way the count balances.
pub(crate) struct WakeToken {
    woken: watch::Sender<u64>,
}

impl WakeToken {
    /// Counts one more event on its way to a parked fiber.
    pub fn count(woken: &watch::Sender<u64>) -> Self {
        woken.send_modify(|n| *n += 1);
        WakeToken { woken: woken.clone() }
    }
}

impl Drop for WakeToken {
    fn drop(&mut self) {
        self.woken.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// A parked wait. When it completes it counts the fiber busy again *before* dropping the
/// inner future (a virtual sleeper stops counting as woken on drop); when it is dropped
/// unfinished (eviction) it counts the fiber busy again so the fiber's own guard balances.
/// It stops counting the fiber busy only once its future is pending: a wait that is ready at
/// once (an effect's answer inside a deadline, say) never shows virtual time a quiet moment.
pub(crate) struct Parked<F: Future> {
    inner: Option<std::pin::Pin<Box<F>>>,
    busy: watch::Sender<u64>,
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
                    self.busy.send_modify(|n| *n += 1);
                    self.parked = false;
                }
                self.inner = None;
                std::task::Poll::Ready(out)
            }
            std::task::Poll::Pending => {
                if !self.parked {
                    self.busy.send_modify(|n| *n = n.saturating_sub(1));
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
            self.busy.send_modify(|n| *n += 1);
        }
    }
}

/// Counts one piece of work in progress for as long as it lives.
pub(crate) struct BusyGuard {
    busy: watch::Sender<u64>,
}

impl BusyGuard {
    /// Counts one more piece of work.
    pub fn count(busy: &watch::Sender<u64>) -> Self {
        busy.send_modify(|n| *n += 1);
        BusyGuard { busy: busy.clone() }
    }
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.busy.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl<F: Future> Parked<F> {
    /// Awaits `fut` as parked work: the caller stops counting as busy until it completes.
    pub fn new(fut: F, busy: &watch::Sender<u64>) -> Self {
        Parked { inner: Some(Box::pin(fut)), busy: busy.clone(), parked: false }
    }
}
