//! Counters and latency histograms (§9.2). Each runtime keeps its own, for
//! [`crate::Runtime::metrics`]; every sample also goes to the `metrics` facade, so a process
//! that installs a recorder (the server installs the Prometheus one) exports them under
//! `durafiber_*` names. Histograms are HDR histograms with 2 significant digits: fixed
//! memory, and a p99 within 1 % of the true value at any scale.

use durafiber_store::lock::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// A counter: this runtime's count, also sent to the `metrics` facade under its name.
pub struct Counter {
    name: &'static str,
    value: AtomicU64,
}

impl Counter {
    const fn new(name: &'static str) -> Self {
        Counter { name, value: AtomicU64::new(0) }
    }

    fn get(&self) -> u64 {
        self.value.load(Ordering::Relaxed)
    }
}

/// The largest latency a histogram tracks exactly, µs (an hour); longer samples count as it.
const HISTOGRAM_MAX_US: u64 = 3_600_000_000;

/// A latency histogram over microseconds.
pub struct Histogram {
    name: &'static str,
    inner: Mutex<Option<hdrhistogram::Histogram<u64>>>,
}

/// A histogram's summary.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct HistogramSummary {
    /// Samples.
    pub count: u64,
    /// Mean, µs.
    pub mean_us: u64,
    /// Median, µs (within 1 %).
    pub p50_us: u64,
    /// 99th percentile, µs (within 1 %).
    pub p99_us: u64,
    /// 99.9th percentile, µs (within 1 %).
    pub p999_us: u64,
    /// Largest sample, µs (within 1 %).
    pub max_us: u64,
}

impl Histogram {
    const fn new(name: &'static str) -> Self {
        Histogram { name, inner: Mutex::new(None) }
    }

    /// Records one sample of a time.
    pub fn record(&self, took: std::time::Duration) {
        self.record_us(u64::try_from(took.as_micros()).unwrap_or(u64::MAX));
    }

    /// Records one sample, µs.
    pub fn record_us(&self, us: u64) {
        metrics::histogram!(self.name).record(us as f64 / 1e6);
        let mut inner = self.inner.lock();
        if inner.is_none() {
            // Created at the first sample: a runtime that never records one pays nothing.
            *inner = hdrhistogram::Histogram::new_with_bounds(1, HISTOGRAM_MAX_US, 2).ok();
        }
        if let Some(h) = inner.as_mut() {
            h.saturating_record(us);
        }
    }

    /// The current summary.
    pub fn summary(&self) -> HistogramSummary {
        let inner = self.inner.lock();
        let Some(h) = inner.as_ref().filter(|h| !h.is_empty()) else {
            return HistogramSummary::default();
        };
        HistogramSummary {
            count: h.len(),
            mean_us: h.mean().round() as u64,
            p50_us: h.value_at_quantile(0.5),
            p99_us: h.value_at_quantile(0.99),
            p999_us: h.value_at_quantile(0.999),
            max_us: h.max(),
        }
    }
}

/// Every counter and histogram of a runtime.
pub struct Metrics {
    /// Runs accepted by `start`.
    pub starts: Counter,
    /// Actors activated (cold starts included).
    pub activations: Counter,
    /// Idle runs hibernated.
    pub hibernations: Counter,
    /// Runs whose fiber left memory while it waited on a durable wait.
    pub parks: Counter,
    /// Runs evicted.
    pub evictions: Counter,
    /// Recovery hooks called.
    pub recoveries: Counter,
    /// Keep-alive heartbeats counted as activity.
    pub heartbeats: Counter,
    /// Alarm retries scheduled.
    pub alarm_retries: Counter,
    /// Alarms dead-lettered.
    pub dead_letters: Counter,
    /// Effects whose committed receipt was returned instead of calling the outside world again.
    pub effects_prevented: Counter,
    /// Runs escalated to a human.
    pub escalations: Counter,
    /// Runs stopped by their budget.
    pub budget_stops: Counter,
    /// Cost units charged by runs (`ctx.charge`).
    pub cost_units: Counter,
    /// Effects performed: receipts committed.
    pub effects: Counter,
    /// Chunks a re-entered fiber emitted differently from the durable ones (after a deploy).
    pub stream_reemissions: Counter,
    /// Settled runs deleted, on request or by retention.
    pub runs_deleted: Counter,
    /// Settled runs deleted by retention.
    pub runs_deleted_by_retention: Counter,
    /// Audit entries deleted by retention.
    pub audit_entries_deleted: Counter,
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
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize)]
pub struct MetricsSnapshot {
    /// Runs accepted by `start`.
    pub starts: u64,
    /// Actors activated (cold starts included).
    pub activations: u64,
    /// Idle runs hibernated.
    pub hibernations: u64,
    /// Runs whose fiber left memory while it waited on a durable wait.
    pub parks: u64,
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
    /// Runs stopped by their budget.
    pub budget_stops: u64,
    /// Cost units charged by runs (`ctx.charge`).
    pub cost_units: u64,
    /// Effects performed: receipts committed.
    pub effects: u64,
    /// Chunks a re-entered fiber emitted differently from the durable ones.
    pub stream_reemissions: u64,
    /// Settled runs deleted, on request or by retention.
    pub runs_deleted: u64,
    /// Settled runs deleted by retention.
    pub runs_deleted_by_retention: u64,
    /// Audit entries deleted by retention.
    pub audit_entries_deleted: u64,
    /// Time from activation to the actor being ready.
    pub cold_start: HistogramSummary,
    /// Time from the runtime's start (or an eviction) to a run's recovery hook being called.
    pub recover_latency: HistogramSummary,
    /// Time for a stash to be committed.
    pub stash_commit: HistogramSummary,
    /// How late alarms fire, against their due time.
    pub alarm_lateness: HistogramSummary,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            starts: Counter::new("durafiber_runs_started_total"),
            activations: Counter::new("durafiber_activations_total"),
            hibernations: Counter::new("durafiber_hibernations_total"),
            parks: Counter::new("durafiber_parks_total"),
            evictions: Counter::new("durafiber_evictions_total"),
            recoveries: Counter::new("durafiber_recoveries_total"),
            heartbeats: Counter::new("durafiber_heartbeats_total"),
            alarm_retries: Counter::new("durafiber_alarm_retries_total"),
            dead_letters: Counter::new("durafiber_dead_letters_total"),
            effects_prevented: Counter::new("durafiber_effects_prevented_total"),
            escalations: Counter::new("durafiber_escalations_total"),
            budget_stops: Counter::new("durafiber_budget_stops_total"),
            cost_units: Counter::new("durafiber_cost_units_total"),
            effects: Counter::new("durafiber_effects_total"),
            stream_reemissions: Counter::new("durafiber_stream_reemissions_total"),
            runs_deleted: Counter::new("durafiber_runs_deleted_total"),
            runs_deleted_by_retention: Counter::new("durafiber_runs_deleted_by_retention_total"),
            audit_entries_deleted: Counter::new("durafiber_audit_entries_deleted_total"),
            cold_start: Histogram::new("durafiber_cold_start_seconds"),
            recover_latency: Histogram::new("durafiber_recover_latency_seconds"),
            stash_commit: Histogram::new("durafiber_stash_commit_seconds"),
            alarm_lateness: Histogram::new("durafiber_alarm_lateness_seconds"),
        }
    }
}

/// Tells the installed `metrics` recorder each metric's help text and unit, for the
/// exporter's `# HELP` lines. Gauges are the server's: it reads them at each scrape.
pub fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    let m = Metrics::default();
    let counters = [
        (&m.starts, "Runs accepted by start."),
        (&m.activations, "Actors activated, cold starts included."),
        (&m.hibernations, "Idle runs hibernated."),
        (&m.parks, "Runs whose fiber left memory while it waited on a durable wait."),
        (&m.evictions, "Runs evicted."),
        (&m.recoveries, "Recovery hooks called."),
        (&m.heartbeats, "Keep-alive heartbeats counted as activity."),
        (&m.alarm_retries, "Alarm retries scheduled."),
        (&m.dead_letters, "Alarms dead-lettered."),
        (&m.effects_prevented, "Effects answered from their committed receipt instead of called again."),
        (&m.escalations, "Runs escalated to a human."),
        (&m.budget_stops, "Runs stopped by their budget (effects, cost units, wall time or recoveries)."),
        (&m.cost_units, "Cost units charged by runs with ctx.charge."),
        (&m.effects, "Effects performed: receipts committed."),
        (
            &m.stream_reemissions,
            "Output chunks a re-entered fiber emitted differently from the durable ones; the durable ones stood.",
        ),
        (&m.runs_deleted, "Settled runs deleted, on request or by retention."),
        (&m.runs_deleted_by_retention, "Settled runs deleted by retention."),
        (&m.audit_entries_deleted, "Audit entries deleted by retention."),
    ];
    for (counter, help) in counters {
        describe_counter!(counter.name, Unit::Count, help);
    }
    let histograms = [
        (&m.cold_start, "Time from activation to the actor being ready."),
        (&m.recover_latency, "Time from the runtime's start or an eviction to a run's recovery hook."),
        (&m.stash_commit, "Time for a stash to be committed."),
        (&m.alarm_lateness, "How late alarms fire, against their due time."),
    ];
    for (histogram, help) in histograms {
        describe_histogram!(histogram.name, Unit::Seconds, help);
    }
    describe_gauge!("durafiber_runs", Unit::Count, "Runs in each state (label state).");
    describe_gauge!("durafiber_live_actors", Unit::Count, "Runs live in this process.");
    describe_gauge!("durafiber_hibernated_runs", Unit::Count, "Open runs not live in this process.");
    describe_gauge!("durafiber_pending_alarms", Unit::Count, "Alarms not yet delivered.");
    describe_gauge!(
        "durafiber_limit_waiting",
        Unit::Count,
        "Effects' calls waiting for their turn in a named limit, by limit."
    );
    describe_gauge!(
        "durafiber_limit_in_flight",
        Unit::Count,
        "Effects' calls made now under a named limit, by limit."
    );
    describe_gauge!("durafiber_store_bytes", Unit::Bytes, "Bytes of the store's files on disk.");
    describe_gauge!(
        "durafiber_checkpoint_lag_seconds",
        Unit::Seconds,
        "How long acknowledged writes have waited in the write-ahead log for their checkpoint at most."
    );
}

impl Metrics {
    pub(crate) fn bump(counter: &Counter) {
        Metrics::add(counter, 1);
    }

    pub(crate) fn add(counter: &Counter, n: u64) {
        counter.value.fetch_add(n, Ordering::Relaxed);
        metrics::counter!(counter.name).increment(n);
    }

    /// A copy of every counter.
    pub fn snapshot(&self) -> MetricsSnapshot {
        MetricsSnapshot {
            starts: self.starts.get(),
            activations: self.activations.get(),
            hibernations: self.hibernations.get(),
            parks: self.parks.get(),
            evictions: self.evictions.get(),
            recoveries: self.recoveries.get(),
            heartbeats: self.heartbeats.get(),
            alarm_retries: self.alarm_retries.get(),
            dead_letters: self.dead_letters.get(),
            effects_prevented: self.effects_prevented.get(),
            escalations: self.escalations.get(),
            budget_stops: self.budget_stops.get(),
            cost_units: self.cost_units.get(),
            effects: self.effects.get(),
            stream_reemissions: self.stream_reemissions.get(),
            runs_deleted: self.runs_deleted.get(),
            runs_deleted_by_retention: self.runs_deleted_by_retention.get(),
            audit_entries_deleted: self.audit_entries_deleted.get(),
            cold_start: self.cold_start.summary(),
            recover_latency: self.recover_latency.summary(),
            stash_commit: self.stash_commit.summary(),
            alarm_lateness: self.alarm_lateness.summary(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_p99_is_within_one_percent_where_log2_buckets_were_off_by_two() {
        let h = Histogram::new("test_seconds");
        // 98 fast samples, 2 at 1,100 µs: the p99 is 1,100 µs. Log2 buckets said 2,047.
        (0..98).for_each(|_| h.record_us(100));
        (0..2).for_each(|_| h.record_us(1_100));
        let s = h.summary();
        assert_eq!(s.count, 100);
        assert!(s.p99_us.abs_diff(1_100) <= 11, "p99 {}", s.p99_us);
        assert!(s.p50_us.abs_diff(100) <= 1, "p50 {}", s.p50_us);
        assert!(s.max_us.abs_diff(1_100) <= 11, "max {}", s.max_us);
    }

    #[test]
    fn an_empty_histogram_summarizes_to_zero_and_a_huge_sample_is_capped() {
        let h = Histogram::new("test_seconds");
        assert_eq!(h.summary(), HistogramSummary::default());
        h.record_us(u64::MAX);
        assert!(h.summary().max_us >= HISTOGRAM_MAX_US / 100 * 99);
    }
}
