//! Whether the writer thread waits for a core: the kernel's count of the time it spent
//! runnable but not running (`/proc/thread-self/schedstat`, second field).
//!
//! The writer may spin for a looping committer's next commit (`barrier::Cadence`). On an idle
//! machine that spares a wake-up per commit; beside busy threads a spinning writer loses its
//! wake-up priority and takes a core from the very task it waits for (one writer fell to
//! 0.1–0.6× raw `fdatasync` beside two busy loops). So it spins only while it is not crowded.

use std::{
    fs::File,
    os::unix::fs::FileExt,
    time::{Duration, Instant},
};

/// How often the run-queue time is read.
const WINDOW: Duration = Duration::from_millis(10);

/// Crowded: waited for a core for more than a twentieth of the window.
const CROWDED_SHARE: u32 = 20;

/// How long a crowded reading holds.
const HOLD: Duration = Duration::from_secs(1);

/// The run-queue time of the thread that made it. Made on the writer thread.
pub(crate) struct Crowding {
    /// `None` where the kernel does not tell: then the thread counts as crowded.
    schedstat: Option<File>,
    read_at: Instant,
    waited_ns: u64,
    crowded_until: Option<Instant>,
}

impl Crowding {
    /// Watches the calling thread.
    pub(crate) fn of_this_thread() -> Self {
        let schedstat = File::open("/proc/thread-self/schedstat").ok();
        let mut crowding = Crowding { schedstat, read_at: Instant::now(), waited_ns: 0, crowded_until: None };
        match crowding.read_waited_ns() {
            Some(ns) => crowding.waited_ns = ns,
            None => crowding.schedstat = None,
        }
        crowding
    }

    /// Whether the thread waited for a core lately. Reads the kernel's count at most once
    /// per `WINDOW`.
    pub(crate) fn crowded(&mut self, now: Instant) -> bool {
        if now.saturating_duration_since(self.read_at) >= WINDOW {
            match self.read_waited_ns() {
                Some(ns) => self.take(now, ns),
                None => self.schedstat = None,
            }
        }
        self.schedstat.is_none() || self.crowded_until.is_some_and(|until| now < until)
    }

    /// Takes in a reading, at `now`, of the thread's run-queue time so far.
    fn take(&mut self, now: Instant, waited_ns: u64) {
        let waited = Duration::from_nanos(waited_ns.saturating_sub(self.waited_ns));
        if waited > now.saturating_duration_since(self.read_at) / CROWDED_SHARE {
            self.crowded_until = now.checked_add(HOLD);
        }
        self.waited_ns = waited_ns;
        self.read_at = now;
    }

    fn read_waited_ns(&self) -> Option<u64> {
        let mut buf = [0u8; 96];
        let n = self.schedstat.as_ref()?.read_at(&mut buf, 0).ok()?;
        let text = std::str::from_utf8(buf.get(..n)?).ok()?;
        text.split_ascii_whitespace().nth(1)?.parse().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_kernel_tells_and_a_thread_that_hardly_ran_is_not_crowded() {
        let mut crowding = Crowding::of_this_thread();
        assert!(crowding.schedstat.is_some(), "this kernel keeps schedstat");
        // A made-up instant far ahead: whatever the thread really waited for a core since
        // it started is far below a twentieth of it.
        let later = crowding.read_at + Duration::from_secs(100);
        assert!(!crowding.crowded(later));
    }

    #[test]
    fn waiting_for_a_core_a_twentieth_of_a_window_is_crowded_for_a_while() {
        let t0 = Instant::now();
        let mut crowding =
            Crowding { schedstat: None, read_at: t0, waited_ns: 1_000_000, crowded_until: None };
        let holds = |c: &Crowding, at: Instant| c.crowded_until.is_some_and(|until| at < until);
        // 0.4 ms of 10: not crowded.
        crowding.take(t0 + WINDOW, 1_400_000);
        assert!(!holds(&crowding, t0 + WINDOW));
        // 2 ms of the next 10: crowded, and it holds.
        let t2 = t0 + WINDOW * 2;
        crowding.take(t2, 3_400_000);
        assert!(holds(&crowding, t2));
        // Quiet readings meanwhile do not end it early.
        crowding.take(t2 + WINDOW, 3_400_000);
        assert!(holds(&crowding, t2 + HOLD / 2));
        assert!(!holds(&crowding, t2 + HOLD));
    }
}
