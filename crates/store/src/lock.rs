//! Locks whose waiters sleep instead of yielding the CPU.
//!
//! `parking_lot`'s locks spin, then call `sched_yield` up to seven times before they sleep.
//! On a machine with more busy threads than cores, a thread that yields can lose its core
//! for a whole scheduler slice — milliseconds — to wait for a lock held for microseconds:
//! beside a CPU hog, the late tail of `bench alarms` was made of such yields. The standard
//! library's locks spin briefly and then wait on a futex, so a waiter is woken as soon as
//! the lock is free. These wrap them with `parking_lot`'s shape: no poisoning, as nothing
//! holding one of them panics on purpose, and a panic elsewhere leaves the data as whole as
//! it was. Also whether the calling thread may block at all (`on_multi_threaded_runtime`),
//! which the writer and the PostgreSQL backend both ask.

use std::{sync::PoisonError, time::Duration};

pub use std::sync::{MutexGuard, RwLockReadGuard, RwLockWriteGuard};

/// A mutual-exclusion lock that never yields the CPU while it waits.
#[derive(Debug, Default)]
pub struct Mutex<T>(std::sync::Mutex<T>);

impl<T> Mutex<T> {
    /// A lock around `value`.
    pub const fn new(value: T) -> Self {
        Mutex(std::sync::Mutex::new(value))
    }

    /// Waits for the lock.
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The lock if it is free now; `None` if another holds it.
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        match self.0.try_lock() {
            Ok(guard) => Some(guard),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }
}

/// Waits for a [`Mutex`]'s data to change.
#[derive(Debug, Default)]
pub struct Condvar(std::sync::Condvar);

impl Condvar {
    /// A condition variable no one waits on yet.
    pub const fn new() -> Self {
        Condvar(std::sync::Condvar::new())
    }

    /// Lets go of `guard` until notified (or woken spuriously), then takes the lock again.
    pub fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        self.0.wait(guard).unwrap_or_else(PoisonError::into_inner)
    }

    /// [`Condvar::wait`], for at most `timeout`.
    pub fn wait_for<'a, T>(&self, guard: MutexGuard<'a, T>, timeout: Duration) -> MutexGuard<'a, T> {
        self.0.wait_timeout(guard, timeout).map_or_else(|e| e.into_inner().0, |(guard, _)| guard)
    }

    /// Wakes one waiter.
    pub fn notify_one(&self) {
        self.0.notify_one();
    }

    /// Wakes every waiter.
    pub fn notify_all(&self) {
        self.0.notify_all();
    }
}

/// A readers-writer lock that never yields the CPU while it waits.
#[derive(Debug, Default)]
pub struct RwLock<T>(std::sync::RwLock<T>);

impl<T> RwLock<T> {
    /// A lock around `value`.
    pub const fn new(value: T) -> Self {
        RwLock(std::sync::RwLock::new(value))
    }

    /// Waits for shared access.
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for exclusive access.
    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Whether this thread runs inside a multi-threaded tokio runtime, whose other workers go
/// on while it blocks (a single-threaded one would stop as a whole): whether a caller may
/// block here.
pub(crate) fn on_multi_threaded_runtime() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|rt| rt.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_while_holding_a_lock_leaves_it_usable() {
        let m = std::sync::Arc::new(Mutex::new(vec![1]));
        let rw = std::sync::Arc::new(RwLock::new(1));
        let (m2, rw2) = (m.clone(), rw.clone());
        let panicked = std::thread::spawn(move || {
            let _m = m2.lock();
            let _w = rw2.write();
            panic!("while holding both");
        })
        .join();
        assert!(panicked.is_err());
        m.lock().push(2);
        *rw.write() += 1;
        assert_eq!(*m.lock(), vec![1, 2]);
        assert_eq!(*rw.read(), 2);
    }

    #[test]
    fn a_waiter_sees_what_the_notifier_changed() {
        let shared = std::sync::Arc::new((Mutex::new(false), Condvar::new()));
        let notifier = shared.clone();
        let t = std::thread::spawn(move || {
            *notifier.0.lock() = true;
            notifier.1.notify_all();
        });
        let (lock, changed) = &*shared;
        let mut done = lock.lock();
        while !*done {
            done = changed.wait_for(done, Duration::from_secs(10));
        }
        drop(done);
        assert!(t.join().is_ok());
    }
}
