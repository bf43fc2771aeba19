//! Locks whose waiters sleep instead of yielding the CPU.
//!
//! `parking_lot`'s locks spin, then call `sched_yield` up to seven times before they sleep.
//! On a machine with more busy threads than cores, a thread that yields can lose its core
//! for a whole scheduler slice — milliseconds — to wait for a lock held for microseconds:
//! beside a CPU hog, the late tail of `bench alarms` was made of such yields. The standard library's locks
//! spin briefly and then wait on a futex, so a waiter is woken as soon as the lock is free.
//! These wrap them with `parking_lot`'s shape: no poisoning, as nothing holding one of
//! them panics on purpose, and a panic elsewhere leaves the data as whole as it was.

use std::sync::{MutexGuard, PoisonError, RwLockReadGuard, RwLockWriteGuard};

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
}
