//! Counters and latency histograms (§9.2). Histograms keep log-scale buckets, so memory stays
//! fixed however many samples arrive.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// A latency histogram over microseconds with power-of-two buckets.
#[derive(Default)]
pub struct Histogram {
    inner: Mutex<HistogramInner>,
}

#[derive(Clone)]
struct HistogramInner {
    buckets: [u64; 64],
    count: u64,
    sum_us: u64,
    max_us: u64,
}

/// A histogram's summary.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct HistogramSummary {
    /// Samples.
    pub count: u64,
    /// Mean, µs.
    pub mean_us: u64,
    /// Median upper bound, µs.
    pub p50_us: u64,
    /// 99th percentile upper bound, µs.
    pub p99_us: u64,
    /// Largest sample, µs.
    pub max_us: u64,
}

impl Default for HistogramInner {
    fn default() -> Self {
        HistogramInner { buckets: [0; 64], count: 0, sum_us: 0, max_us: 0 }
    }
}

impl Histogram {
    /// Records one sample.
    pub fn record_us(&self, us: u64) {
        let mut h = self.inner.lock();
        let bucket = (64 - us.leading_zeros()) as usize;
        h.buckets[bucket.min(63)] += 1;
        h.count += 1;
        h.sum_us = h.sum_us.saturating_add(us);
        h.max_us = h.max_us.max(us);
    }

    /// The current summary.
    pub fn summary(&self) -> HistogramSummary {
        let h = self.inner.lock().clone();
        let quantile = |q: f64| -> u64 {
            let target = ((h.count as f64) * q).ceil() as u64;
            let mut seen = 0;
            for (i, n) in h.buckets.iter().enumerate() {
                seen += n;
                if seen >= target.max(1) {
                    return if i == 0 { 0 } else { (1u64 << i).saturating_sub(1).min(h.max_us) };
                }
            }
            h.max_us
        };
        HistogramSummary {
            count: h.count,
            mean_us: h.sum_us.checked_div(h.count).unwrap_or(0),
            p50_us: quantile(0.5),
            p99_us: quantile(0.99),
            max_us: h.max_us,
        }
    }
}

/// Every counter and histogram of a runtime.
#[derive(Default)]
pub struct Metrics {
    /// Runs accepted by `start`.
    pub starts: AtomicU64,
    /// Actors activated (cold starts included).
    pub activations: AtomicU64,
    /// Idle runs hibernated.
    pub hibernations: AtomicU64,
    /// Runs evicted.
    pub evictions: AtomicU64,
    /// Recovery hooks called.
    pub recoveries: AtomicU64,
    /// Keep-alive heartbeats counted as activity.
    pub heartbeats: AtomicU64,
    /// Alarm retries scheduled.
    pub alarm_retries: AtomicU64,
    /// Alarms dead-lettered.
    pub dead_letters: AtomicU64,
    /// Effects whose committed receipt was returned instead of calling the outside world again.
    pub effects_prevented: AtomicU64,
    /// Runs escalated to a human.
    pub escalations: AtomicU64,
    /// Time from activation to the actor being ready.
    pub cold_start: Histogram,
    /// Time from the runtime's start (or an eviction) to a run's recovery hook being called.
    pub recover_latency: Histogram,
    /// Time for a stash to be committed.
    pub stash_commit: Histogram,
    /// How late alarms fire, against their due time.
    pub alarm_lateness: Histogram,
}

/// A copy of the counters, for output.
#[derive(Debug, Clone, Serialize)]
pub struct MetricsSnapshot {
    /// Runs accepted by `start`.
    pub starts: u64,
    /// Actors activated (cold starts included).
    pub activations: u64,
    /// Idle runs hibernated.
    pub hibernations: u64,
    /// Runs evicted.
    pub evictions: u64,
    /// Recovery hooks called.
    pub recoveries: u64,
    /// Keep-alive heartbeats counted as activity.
    pub heartbeats: u64,
    /// Alarm retries scheduled.
    pub alarm_retries: u64,
    /// Alarms dead-lettered.
    pub dead_letters: u64,
    /// Effects whose committed receipt was returned instead of calling the outside world again.
    pub effects_prevented: u64,
    /// Runs escalated to a human.
    pub escalations: u64,
    /// Time from activation to the actor being ready.
    pub cold_start: HistogramSummary,
    /// Time from the runtime's start (or an eviction) to a run's recovery hook being called.
    pub recover_latency: HistogramSummary,
    /// Time for a stash to be committed.
    pub stash_commit: HistogramSummary,
    /// How late alarms fire, against their due time.
    pub alarm_lateness: HistogramSummary,
}

impl Metrics {
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A copy of every counter.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        MetricsSnapshot {
            starts: get(&self.starts),
            activations: get(&self.activations),
            hibernations: get(&self.hibernations),
            evictions: get(&self.evictions),
            recoveries: get(&self.recoveries),
            heartbeats: get(&self.heartbeats),
            alarm_retries: get(&self.alarm_retries),
            dead_letters: get(&self.dead_letters),
            effects_prevented: get(&self.effects_prevented),
            escalations: get(&self.escalations),
            cold_start: self.cold_start.summary(),
            recover_latency: self.recover_latency.summary(),
            stash_commit: self.stash_commit.summary(),
            alarm_lateness: self.alarm_lateness.summary(),
        }
    }
}
