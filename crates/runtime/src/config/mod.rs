//! Runtime configuration, with durations written the humantime way ("10s", "2m", "72h") so
//! that a config file reads as the contract does.

mod named_limit;
mod retention;
mod traces;

pub use named_limit::{NamedLimit, Rate};
pub use retention::Retention;
pub use traces::TraceExport;

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{error::RuntimeError, limits};

pub use durafiber_api::{Budget, DurabilityMode};

/// Everything a runtime can be told. `Default` gives the contract's defaults.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RuntimeConfig {
    /// Default durability of stashes.
    pub durability: DurabilityMode,
    /// Async stashes are durable within this window.
    #[serde(with = "humantime_serde")]
    pub flush_every: Duration,
    /// Largest stash accepted, in bytes.
    pub stash_bytes_max: usize,
    /// Chunk data one run's output stream (`ctx.emit`) may hold, in bytes.
    pub stream_bytes_max: u64,
    /// Every run's budget, under what its own options set.
    pub budget: Budget,
    /// Keys one run may hold in `ctx.storage()`.
    pub storage_keys_max: usize,
    /// Whether a re-entered fiber that emits, at a place its stream already holds, a chunk
    /// other than the durable one fails the run (`StreamDiverged`). Off by default: the
    /// durable chunk stands and the difference is recorded, so a deploy that rewords a
    /// progress message escalates no run. `AgentCheck` turns it on: within one build, a
    /// different re-emission is a determinism bug.
    pub strict_streams: bool,
    /// Whether each storage write is durable on its own (`Sync`), as on PostgreSQL, instead
    /// of with the run's next boundary. Off by default; `AgentCheck::storage_durable_at_once`
    /// turns it on to show an agent what a re-entry at a stash finds written after it.
    pub storage_writes_sync: bool,
    /// Whether effects' calls are stopped before they leave the process: an effect whose
    /// receipt the ledger does not hold ends its run, cancelled, with
    /// `AgentError::CallStopped`'s reason, instead of calling out. Off by default; what
    /// `check-deploy` replays open runs with, on a scratch copy of the store.
    pub stop_calls: bool,
    /// Boundaries each run keeps in its history, the latest ones (32): their stashes, to
    /// list (`Runtime::history`) and to fork from. 0 keeps none, and no run can be forked.
    pub history_max: u32,
    /// Recovery attempts before escalation.
    pub max_recover_attempts: u32,
    /// Runs older than this when found interrupted are escalated.
    #[serde(with = "humantime_serde")]
    pub max_age: Duration,
    /// Silence after an approval request escalates after this long.
    #[serde(with = "humantime_serde")]
    pub escalate_after: Duration,
    /// An alarm handler running longer than this has failed.
    #[serde(with = "humantime_serde")]
    pub alarm_wall_limit: Duration,
    /// An `on_message` handler running longer than this has failed; its caller gets the error.
    #[serde(with = "humantime_serde")]
    pub message_wall_limit: Duration,
    /// Retry n of a failed alarm waits this × 2^(n-1), plus up to 25% jitter.
    #[serde(with = "humantime_serde")]
    pub alarm_retry_base: Duration,
    /// Idle hibernateable runs hibernate after this long, and fibers idle on a durable wait
    /// leave memory (are parked) after it.
    #[serde(with = "humantime_serde")]
    pub hibernate_after: Duration,
    /// Fibers waiting on a durable wait (an approval, a sleep, an event) kept in memory at
    /// most (10,000). A waiting fiber leaves memory after `hibernate_after` anyway; past this
    /// many, the longest waiting leave at once, so a burst of waiting runs costs a bounded
    /// amount of memory. The wait's end re-enters a parked run from its journal.
    pub waiting_in_memory: usize,
    /// Idle non-hibernateable runs are evicted after a draw from this range: "70s..140s".
    pub evict_after: String,
    /// A held keep-alive counts as activity this often.
    #[serde(with = "humantime_serde")]
    pub keep_alive_heartbeat: Duration,
    /// Whether a running fiber holds a keep-alive by itself.
    pub fiber_keep_alive: bool,
    /// Free space new work must leave on the data filesystem ("64MiB"): below it, new runs
    /// and alarm sets are refused with `StorageFull`; running boundaries go on down to a
    /// quarter of it, then wait for space.
    pub disk_reserve: String,
    /// Memory for sled's page cache ("192MiB"): what reads of stored runs may keep in memory.
    /// A smaller cache costs reads of cold runs; the default keeps a million pending alarms'
    /// bulk load under 1 GiB.
    pub cache: String,
    /// A durability barrier that has not returned after this long fails the store.
    #[serde(with = "humantime_serde")]
    pub barrier_timeout: Duration,
    /// A quiet store moves its logged writes into sled at most this long after its last
    /// checkpoint, however few they are ("30s"), so that acknowledged writes do not live
    /// only in the write-ahead log for long.
    #[serde(with = "humantime_serde")]
    pub checkpoint_after: Duration,
    /// Seed of every random draw (eviction times, jitter, chaos).
    pub seed: u64,
    /// Probability, drawn at each boundary a fiber commits, that chaos evicts the run right
    /// there; 0 switches it off.
    pub chaos_evict_rate: f64,
    /// On a store several nodes share: how long a node's lease on its shards lasts without
    /// a renewal. It renews every third of it and stops running the shards' runs by itself
    /// at three quarters; a node that died has its shards taken over after at most this.
    #[serde(with = "humantime_serde")]
    pub lease_ttl: Duration,
    /// On a store several nodes share: how far this machine's clock may be from the
    /// database's. Times that cross nodes (wakes, alarms, deadlines) are on the database's
    /// clock whatever this one says; a node whose clock is further off than this warns and
    /// takes no shard until it is back within it.
    #[serde(with = "humantime_serde")]
    pub max_clock_skew: Duration,
    /// Alarms the scheduler keeps in memory, the earliest ones; the rest wait in the store's
    /// due index and are read in as the window runs down. A burst of alarms due together
    /// that is larger than this fires while the index is read, which costs some lateness.
    pub alarm_window: usize,
    /// Time a client has to send a request's headers ("10s"); an idle connection is closed
    /// after it too. A whole request arrives within this and `http_body_timeout`.
    #[serde(with = "humantime_serde")]
    pub http_header_timeout: Duration,
    /// Time a client has to send a request's whole body once its headers are in ("5s"):
    /// a slower one is refused with 408 and its connection closed, so a stalled body holds
    /// no slot for long.
    #[serde(with = "humantime_serde")]
    pub http_body_timeout: Duration,
    /// Most connections the server holds open at once; by default sized from the process's
    /// file-descriptor limit (raised to its hard limit at start). A quarter of them is kept
    /// for callers who present a valid token or console session.
    pub http_connections_max: Option<usize>,
    /// How long settled runs and audit entries are kept (nothing is deleted by default).
    pub retention: Retention,
    /// Where runs' traces are exported (nowhere by default).
    pub traces: TraceExport,
    /// Named limits on effects' calls, by name (none by default); see [`NamedLimit`].
    pub limits: std::collections::BTreeMap<String, NamedLimit>,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            durability: DurabilityMode::Sync,
            flush_every: Duration::from_millis(5),
            stash_bytes_max: limits::STASH_BYTES_MAX_DEFAULT,
            stream_bytes_max: limits::STREAM_BYTES_MAX_DEFAULT,
            budget: Budget::default(),
            storage_keys_max: limits::STORAGE_KEYS_MAX_DEFAULT,
            storage_writes_sync: false,
            strict_streams: false,
            stop_calls: false,
            history_max: limits::HISTORY_MAX_DEFAULT,
            max_recover_attempts: limits::RECOVER_ATTEMPTS_MAX_DEFAULT,
            max_age: limits::MAX_AGE_DEFAULT,
            escalate_after: limits::ESCALATE_AFTER_DEFAULT,
            alarm_wall_limit: limits::ALARM_WALL_LIMIT_DEFAULT,
            message_wall_limit: limits::MESSAGE_WALL_LIMIT_DEFAULT,
            alarm_retry_base: limits::ALARM_RETRY_BASE,
            hibernate_after: limits::HIBERNATE_AFTER_DEFAULT,
            waiting_in_memory: limits::WAITING_IN_MEMORY_DEFAULT,
            evict_after: format!(
                "{}..{}",
                humantime::format_duration(limits::EVICT_AFTER_MIN_DEFAULT),
                humantime::format_duration(limits::EVICT_AFTER_MAX_DEFAULT)
            ),
            keep_alive_heartbeat: limits::KEEP_ALIVE_HEARTBEAT_DEFAULT,
            fiber_keep_alive: true,
            disk_reserve: "64MiB".into(),
            cache: "192MiB".into(),
            barrier_timeout: limits::BARRIER_TIMEOUT_DEFAULT,
            checkpoint_after: durafiber_store::sled_backend::CHECKPOINT_AFTER_DEFAULT,
            seed: 0,
            chaos_evict_rate: 0.0,
            lease_ttl: limits::LEASE_TTL_DEFAULT,
            max_clock_skew: limits::MAX_CLOCK_SKEW_DEFAULT,
            alarm_window: limits::ALARM_WINDOW_DEFAULT,
            http_header_timeout: limits::HTTP_HEADER_READ_TIMEOUT,
            http_body_timeout: limits::HTTP_BODY_TIMEOUT_DEFAULT,
            http_connections_max: None,
            retention: Retention::default(),
            traces: TraceExport::default(),
            limits: Default::default(),
        }
    }
}

impl RuntimeConfig {
    /// Parses a JSON configuration (durations as humantime strings); unknown keys are errors.
    pub fn from_json(text: &str) -> Result<Self, RuntimeError> {
        let config: RuntimeConfig =
            serde_json::from_str(text).map_err(|e| RuntimeError::Config(format!("config: {e}")))?;
        config.validate()?;
        Ok(config)
    }

    /// `disk_reserve`, in bytes.
    pub fn disk_reserve_bytes(&self) -> Result<u64, RuntimeError> {
        parse_bytes(&self.disk_reserve)
    }

    /// The store settings this configuration implies.
    pub fn store_config(&self) -> Result<durafiber_store::StoreConfig, RuntimeError> {
        Ok(durafiber_store::StoreConfig {
            flush_every: self.flush_every,
            disk_reserve_bytes: self.disk_reserve_bytes()?,
            barrier_timeout: self.barrier_timeout,
            checkpoint_after: self.checkpoint_after,
            cache_bytes: parse_bytes(&self.cache)?,
            ..Default::default()
        })
    }

    /// The eviction range, parsed.
    pub fn evict_after_range(&self) -> Result<(Duration, Duration), RuntimeError> {
        parse_range(&self.evict_after)
    }

    /// Checks every relation between settings.
    pub fn validate(&self) -> Result<(), RuntimeError> {
        let (lo, hi) = self.evict_after_range()?;
        parse_bytes(&self.cache).map_err(|e| RuntimeError::Config(format!("cache: {e}")))?;
        if self.keep_alive_heartbeat.is_zero() || self.keep_alive_heartbeat >= lo {
            return Err(RuntimeError::Config(format!(
                "keep_alive_heartbeat ({}) must be above zero and below the shortest eviction ({})",
                humantime::format_duration(self.keep_alive_heartbeat),
                humantime::format_duration(lo)
            )));
        }
        if hi < lo {
            return Err(RuntimeError::Config("evict_after: the range's end is before its start".into()));
        }
        if !(0.0..=1.0).contains(&self.chaos_evict_rate) {
            return Err(RuntimeError::Config("chaos_evict_rate must be within 0..=1".into()));
        }
        self.disk_reserve_bytes()?;
        if self.checkpoint_after.is_zero() {
            return Err(RuntimeError::Config("checkpoint_after must be above zero".into()));
        }
        self.validate_http()?;
        if self.barrier_timeout.is_zero() {
            return Err(RuntimeError::Config("barrier_timeout must be above zero".into()));
        }
        if self.lease_ttl < Duration::from_millis(300) {
            return Err(RuntimeError::Config("lease_ttl must be at least 300ms".into()));
        }
        // Below a few milliseconds no heartbeat's round trip could measure the offset.
        if self.max_clock_skew < Duration::from_millis(10) {
            return Err(RuntimeError::Config("max_clock_skew must be at least 10ms".into()));
        }
        if self.alarm_window < limits::ALARM_WINDOW_MIN {
            return Err(RuntimeError::Config(format!(
                "alarm_window must be at least {}",
                limits::ALARM_WINDOW_MIN
            )));
        }
        let settings = self.retention.settings();
        if let Some((what, _)) = settings.iter().find(|(_, d)| d.is_some_and(|d| d.is_zero())) {
            return Err(RuntimeError::Config(format!(
                "retention.{what} must be above zero (leave it out to keep for ever)"
            )));
        }
        if self.max_recover_attempts == 0 {
            return Err(RuntimeError::Config("max_recover_attempts must be at least 1".into()));
        }
        self.validate_limits()
    }

    /// The server's settings: its timeouts and its connections.
    fn validate_http(&self) -> Result<(), RuntimeError> {
        if self.http_header_timeout.is_zero() {
            return Err(RuntimeError::Config("http_header_timeout must be above zero".into()));
        }
        if self.http_body_timeout.is_zero() {
            return Err(RuntimeError::Config("http_body_timeout must be above zero".into()));
        }
        if self.http_connections_max.is_some_and(|n| n < limits::HTTP_CONNECTIONS_MIN) {
            return Err(RuntimeError::Config(format!(
                "http_connections_max must be at least {}",
                limits::HTTP_CONNECTIONS_MIN
            )));
        }
        Ok(())
    }

    /// The named limits on effects' calls.
    fn validate_limits(&self) -> Result<(), RuntimeError> {
        for (name, limit) in &self.limits {
            durafiber_store::tables::check_id("limit name", name)
                .map_err(|e| RuntimeError::Config(format!("limits: {e}")))?;
            if limit.concurrency.is_none() && limit.rate.is_none() {
                return Err(RuntimeError::Config(format!(
                    "limits.{name}: give it a concurrency, a rate or both"
                )));
            }
            if limit.concurrency == Some(0) {
                return Err(RuntimeError::Config(format!("limits.{name}.concurrency must be at least 1")));
            }
        }
        Ok(())
    }
}

/// Parses a size the way a person writes it: "64MiB", "512KiB", "1GiB", "10MB", "4096".
pub fn parse_bytes(text: &str) -> Result<u64, RuntimeError> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits.parse().map_err(|_| RuntimeError::Config(format!("size {text:?}: no number")))?;
    let factor: u64 = match unit.trim() {
        "" | "B" => 1,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        other => return Err(RuntimeError::Config(format!("size {text:?}: unknown unit {other:?}"))),
    };
    n.checked_mul(factor).ok_or_else(|| RuntimeError::Config(format!("size {text:?} is too large")))
}

/// Parses "70s..140s" (or a single duration, meaning a fixed value).
pub fn parse_range(text: &str) -> Result<(Duration, Duration), RuntimeError> {
    let bad = |e: String| RuntimeError::Config(format!("duration range {text:?}: {e}"));
    match text.split_once("..") {
        Some((a, b)) => Ok((
            humantime::parse_duration(a.trim()).map_err(|e| bad(e.to_string()))?,
            humantime::parse_duration(b.trim()).map_err(|e| bad(e.to_string()))?,
        )),
        None => {
            let d = humantime::parse_duration(text.trim()).map_err(|e| bad(e.to_string()))?;
            Ok((d, d))
        }
    }
}

/// Serde glue: durations as humantime strings ("10s").
#[cfg(test)]
mod tests;
