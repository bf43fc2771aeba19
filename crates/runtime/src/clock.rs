//! Every timing in the runtime goes through [`Clock`]: the system clock in production, a
//! [`VirtualClock`] in tests and simulations, where 140 seconds of idleness is one call.
//!
//! This is the only module that reads the machine's time or sleeps on it.

use durafiber_store::lock::{Mutex, MutexGuard};
use std::{
    collections::BTreeMap,
    future::Future,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicI64, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use durafiber_api::Timestamp;
use tokio::sync::{oneshot, watch};

/// A boxed future that completes at a point in time.
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// The source of time.
pub trait Clock: Send + Sync + 'static {
    /// The time now.
    fn now(&self) -> Timestamp;
    /// Completes once `now() >= at`.
    fn sleep_until(&self, at: Timestamp) -> Sleep;
    /// Whether time moves only when a test advances it.
    fn is_virtual(&self) -> bool {
        false
    }
}

/// Sleeps for `d` on `clock`.
pub fn sleep(clock: &dyn Clock, d: Duration) -> Sleep {
    clock.sleep_until(clock.now().saturating_add(d))
}

/// Runs `fut` for at most `limit` of `clock`'s time; `None` when the limit won.
pub async fn timeout<F: Future>(clock: &dyn Clock, limit: Duration, fut: F) -> Option<F::Output> {
    let deadline = sleep(clock, limit);
    tokio::select! {
        out = fut => Some(out),
        () = deadline => None,
    }
}

/// Wall time from the operating system.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
        Timestamp::ZERO.saturating_add(since_epoch)
    }

    fn sleep_until(&self, at: Timestamp) -> Sleep {
        Box::pin(tokio::time::sleep(at.saturating_since(self.now())))
    }
}

/// Moves `at` by `by_ms` milliseconds, staying within time.
fn shifted(at: Timestamp, by_ms: i64) -> Timestamp {
    let by = Duration::from_millis(by_ms.unsigned_abs());
    if by_ms >= 0 { at.saturating_add(by) } else { at.saturating_sub(by) }
}

/// The time every node of a shared store agrees on: this machine's clock plus an offset
/// that each lease heartbeat sets to the database's clock minus this one's. A due time one
/// node stores is then the same instant to the node that takes the run over, however far
/// apart their own clocks are.
pub struct AgreedClock {
    local: Arc<dyn Clock>,
    offset_ms: AtomicI64,
    /// Whether a heartbeat has measured the offset yet: until one has, this node's time is
    /// only its own, and it takes no shard.
    measured: AtomicBool,
}

impl AgreedClock {
    /// `local`'s time, until the first heartbeat says how far it is from the database's.
    pub fn new(local: Arc<dyn Clock>) -> Self {
        AgreedClock { local, offset_ms: AtomicI64::new(0), measured: AtomicBool::new(false) }
    }

    /// This machine's own time.
    pub fn local(&self) -> Timestamp {
        self.local.now()
    }

    /// The database's clock minus this machine's, ms, as last measured.
    pub fn offset_ms(&self) -> i64 {
        self.offset_ms.load(Ordering::Relaxed)
    }

    /// Sets the offset from a reading of the database's clock, `database`, taken between
    /// `sent` and `answered` of this machine's time (its midpoint is when it was read).
    /// Returns the offset, ms.
    pub fn measured(&self, database: Timestamp, sent: Timestamp, answered: Timestamp) -> i64 {
        let midpoint = sent.as_millis() / 2 + answered.as_millis() / 2;
        let offset = i64::try_from(i128::from(database.as_millis()) - i128::from(midpoint)).unwrap_or(0);
        self.offset_ms.store(offset, Ordering::Relaxed);
        self.measured.store(true, Ordering::Release);
        offset
    }

    /// Whether the offset has been measured once.
    pub fn is_measured(&self) -> bool {
        self.measured.load(Ordering::Acquire)
    }

    /// The agreed time `at` on this machine's clock.
    pub fn to_local(&self, at: Timestamp) -> Timestamp {
        shifted(at, -self.offset_ms())
    }
}

impl Clock for AgreedClock {
    fn now(&self) -> Timestamp {
        shifted(self.local.now(), self.offset_ms())
    }

    fn sleep_until(&self, at: Timestamp) -> Sleep {
        self.local.sleep_until(self.to_local(at))
    }
}

/// A runtime's time: its clock, and on a store several nodes share the agreed clock it
/// reads, whose offset the lease heartbeat sets.
pub(crate) struct Time {
    /// The runtime's time: on a store several nodes share, `agreed`.
    pub clock: Arc<dyn Clock>,
    /// On a store several nodes share (and a clock that is not virtual): the time base the
    /// nodes agree on, the database's clock, which `clock` reads.
    pub agreed: Option<Arc<AgreedClock>>,
}

impl Time {
    /// `local`'s time, agreed with the other nodes' when `agree` (a shared store, a clock
    /// that is not virtual).
    pub fn new(local: Arc<dyn Clock>, agree: bool) -> Self {
        let agreed = agree.then(|| Arc::new(AgreedClock::new(local.clone())));
        let clock: Arc<dyn Clock> = match &agreed {
            Some(agreed) => agreed.clone(),
            None => local,
        };
        Time { clock, agreed }
    }

    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// The runtime's time `at` on this machine's own clock.
    pub fn to_local(&self, at: Timestamp) -> Timestamp {
        self.agreed.as_ref().map_or(at, |a| a.to_local(at))
    }
}

/// Time that moves only when told to, deterministically.
#[derive(Clone)]
pub struct VirtualClock {
    inner: Arc<Mutex<VirtualState>>,
    /// Sleepers woken by `set` that have not yet resumed: virtual time must wait for them.
    woken: watch::Sender<u64>,
}

struct VirtualState {
    now: Timestamp,
    next_waiter_id: u64,
    waiters: BTreeMap<(Timestamp, u64), oneshot::Sender<()>>,
}

impl VirtualClock {
    /// A clock standing at `start`.
    pub fn new(start: Timestamp) -> Self {
        VirtualClock {
            inner: Arc::new(Mutex::new(VirtualState {
                now: start,
                next_waiter_id: 0,
                waiters: BTreeMap::new(),
            })),
            woken: watch::Sender::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, VirtualState> {
        self.inner.lock()
    }

    /// Moves time to `at` (never backwards) and wakes every sleeper due by then.
    pub fn set(&self, at: Timestamp) {
        let mut s = self.lock();
        s.now = s.now.max(at);
        let now = s.now;
        let later = s.waiters.split_off(&(now.saturating_add(Duration::from_millis(1)), 0));
        let due = std::mem::replace(&mut s.waiters, later);
        drop(s);
        for (_, w) in due {
            self.woken.send_modify(|n| *n += 1);
            if w.send(()).is_err() {
                self.woken.send_modify(|n| *n -= 1);
            }
        }
    }

    /// Completes when every sleeper woken so far has resumed (or was dropped).
    pub async fn woken_resumed(&self) {
        let _ = self.woken.subscribe().wait_for(|n| *n == 0).await;
    }

    /// Sleepers woken but not yet resumed.
    pub fn woken_pending(&self) -> u64 {
        *self.woken.borrow()
    }

    /// The earliest time a sleeper waits for.
    pub fn next_wake(&self) -> Option<Timestamp> {
        let mut s = self.lock();
        // Sleepers whose future was dropped (a cancelled select) no longer count.
        s.waiters.retain(|_, w| !w.is_closed());
        s.waiters.keys().next().map(|(at, _)| *at)
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> Timestamp {
        self.lock().now
    }

    fn sleep_until(&self, at: Timestamp) -> Sleep {
        let mut s = self.lock();
        if at <= s.now {
            return Box::pin(std::future::ready(()));
        }
        let (tx, rx) = oneshot::channel();
        let id = s.next_waiter_id;
        s.next_waiter_id += 1;
        s.waiters.insert((at, id), tx);
        Box::pin(VirtualSleep { rx, woken: self.woken.clone(), fired: false })
    }

    fn is_virtual(&self) -> bool {
        true
    }
}

/// A sleeper on the virtual clock. It stays counted as woken until it is dropped, so that
/// a parked fiber can count itself busy again before it stops counting as woken (see
/// `Shared::parked`): virtual time never sees a moment where neither is counted.
struct VirtualSleep {
    rx: oneshot::Receiver<()>,
    woken: watch::Sender<u64>,
    fired: bool,
}

impl Future for VirtualSleep {
    type Output = ();

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        match std::pin::Pin::new(&mut self.rx).poll(cx) {
            std::task::Poll::Ready(Ok(())) => {
                self.fired = true;
                std::task::Poll::Ready(())
            }
            // A dropped clock never wakes its sleepers; neither would time that stopped.
            std::task::Poll::Ready(Err(_)) | std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
}

impl Drop for VirtualSleep {
    fn drop(&mut self) {
        // Closed first, so the clock cannot wake it after it looked: a wake sent between the
        // look and the receiver's own drop would be counted by neither side, and the sleeper
        // would stay counted woken for good. Closed, a wake either came before (it is there
        // to take, and this side uncounts it) or fails to send (and the clock uncounts it).
        self.rx.close();
        // Fired and resumed, or woken but dropped before resuming (an evicted fiber).
        if self.fired || self.rx.try_recv().is_ok() {
            self.woken.send_modify(|n| *n = n.saturating_sub(1));
        }
    }
}

/// Measures real elapsed time, for latency figures (cold starts, commits), never for logic.
#[derive(Debug, Clone, Copy)]
pub struct Stopwatch(Instant);

impl Stopwatch {
    /// Starts measuring.
    pub fn start() -> Self {
        Stopwatch(Instant::now())
    }

    /// Microseconds since start.
    pub fn elapsed_us(&self) -> u64 {
        self.0.elapsed().as_micros() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sleeper dropped while the clock wakes it (an evicted fiber, a handler past its wall
    /// limit) is uncounted exactly once: counted woken for good, it would keep
    /// `woken_resumed`, and every `advance`, waiting forever.
    #[test]
    fn a_sleeper_dropped_as_it_is_woken_is_uncounted_once() {
        for round in 0..2_000u64 {
            let clock = VirtualClock::new(Timestamp::from_millis(0));
            let sleeper = clock.sleep_until(Timestamp::from_millis(1));
            let start = std::sync::Arc::new(std::sync::Barrier::new(2));
            let dropper = std::thread::spawn({
                let start = start.clone();
                move || {
                    start.wait();
                    drop(sleeper);
                }
            });
            start.wait();
            clock.set(Timestamp::from_millis(1));
            dropper.join().expect("dropper");
            assert_eq!(clock.woken_pending(), 0, "round {round}: a dropped sleeper stayed counted woken");
        }
    }

    #[tokio::test]
    async fn a_virtual_sleeper_wakes_exactly_when_time_reaches_it() {
        let clock = VirtualClock::new(Timestamp::from_millis(1_000));
        let mut woke = Box::pin(clock.sleep_until(Timestamp::from_millis(141_000)));
        clock.set(Timestamp::from_millis(140_999));
        assert!(futures::poll!(woke.as_mut()).is_pending());
        clock.set(Timestamp::from_millis(141_000));
        assert!(futures::poll!(woke.as_mut()).is_ready());
    }

    /// A machine half an hour ahead of the database tells the database's time, and sleeps
    /// until an agreed time on its own clock.
    #[tokio::test]
    async fn the_agreed_clock_reads_the_databases_time_off_its_own() {
        let local = VirtualClock::new(Timestamp::from_millis(1_800_000 + 10_000));
        let agreed = AgreedClock::new(Arc::new(local.clone()));
        assert_eq!(agreed.now(), Timestamp::from_millis(1_810_000), "its own time until a heartbeat");
        // The database said 10,000 while this clock went from 1,809,990 to 1,810,010.
        let at = Timestamp::from_millis;
        assert!(!agreed.is_measured(), "no heartbeat has measured it yet");
        assert_eq!(agreed.measured(at(10_000), at(1_809_990), at(1_810_010)), -1_800_000);
        assert!(agreed.is_measured());
        assert_eq!(agreed.now(), Timestamp::from_millis(10_000));
        assert_eq!(agreed.to_local(at(13_000)), at(1_813_000));
        let mut woke = Box::pin(agreed.sleep_until(Timestamp::from_millis(13_000)));
        local.set(Timestamp::from_millis(1_812_999));
        assert!(futures::poll!(woke.as_mut()).is_pending());
        local.set(Timestamp::from_millis(1_813_000));
        assert!(futures::poll!(woke.as_mut()).is_ready());
        assert_eq!(shifted(Timestamp::from_millis(5), -10), Timestamp::from_millis(0), "never below zero");
        assert_eq!(
            shifted(Timestamp::from_millis(u64::MAX - 1), 10),
            Timestamp::from_millis(u64::MAX),
            "nor past the end"
        );
    }
}
