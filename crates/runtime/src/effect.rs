//! Effects through the idempotency ledger (§5).
//!
//! Ledger entry lifecycle: absent → `Prepared{key, args_hash}` → `Committed{receipt}`.
//! The key is minted once, written durably before the first call, and reused on every
//! re-entry, so an upstream that deduplicates on it sees one request however often the
//! run is resumed. A committed entry returns its receipt without calling the outside world.
//! The entry's reading, preparing and committing are `effect_ledger.rs`'s; this file makes
//! the calls, with their policy: retries, backoff, `Retry-After`, timeouts, named limits.

use crate::kernel::commit as committer;
use durafiber_api::Timestamp;
use std::{future::Future, time::Duration};

use durafiber_store::tables::{self, Key, LedgerEntry, keys};
use serde::{Serialize, de::DeserializeOwned};

use crate::boundary::Boundary;
use crate::{
    clock,
    effect_ledger::{Entered, ReceiptHooks, commit, enter},
    error::AgentError,
    kernel::shared::RawCtx,
    limits, trace,
};

/// How an effect's calls are retried within one entry of the fiber (`Ctx::effect_with`).
/// The same policy holds for the first attempt and for a recovered one: a recovery re-enters
/// the effect with the same idempotency key and a fresh count of attempts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectOptions {
    /// Calls at most, the first included (at least 1).
    pub attempts: u32,
    /// The backoff cap before the second call; it doubles per call, full jitter.
    pub backoff_initial: Duration,
    /// The largest backoff cap.
    pub backoff_max: Duration,
    /// How long one call may take before it counts as a retryable failure; `None`: no limit.
    pub timeout: Option<Duration>,
    /// The named limit each call waits its turn in (`limits` in the runtime's config): at
    /// most so many calls at once and per period, across the runtime and its nodes.
    pub limit: Option<String>,
}

impl Default for EffectOptions {
    /// `Ctx::effect`'s policy: 3 calls, backoff from 100 ms up to 3 s, no timeout.
    fn default() -> Self {
        EffectOptions {
            attempts: limits::EFFECT_ATTEMPTS_MAX,
            backoff_initial: limits::EFFECT_BACKOFF_MIN,
            backoff_max: limits::EFFECT_BACKOFF_MAX,
            timeout: None,
            limit: None,
        }
    }
}

/// Why an effect's call failed, and whether calling again may help.
///
/// Any `std::error::Error` converts into `Retryable` with `?`; say `Permanent` for an answer
/// that will not change (a 4xx), or use [`EffectError::from_status`] — or
/// [`EffectError::from_response`], which honours a `Retry-After`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EffectError {
    /// An outage, a timeout, a 5xx: tried again while the policy allows.
    Retryable(String),
    /// A refusal: reaches the fiber at once as `AgentError::EffectRejected`.
    Permanent(String),
    /// The upstream asked to be called again no sooner than `after` (a 429 or a 503 with
    /// `Retry-After`): the next call waits that long instead of the policy's backoff (at
    /// most [`limits::RETRY_AFTER_MAX`]), and counts among the policy's calls.
    RetryAfter {
        /// What the upstream said.
        error: String,
        /// How long it asked to be left alone.
        after: Duration,
    },
}

impl EffectError {
    /// A failure worth another call.
    pub fn retryable(e: impl std::fmt::Display) -> Self {
        EffectError::Retryable(e.to_string())
    }

    /// A refusal no retry will change.
    pub fn permanent(e: impl std::fmt::Display) -> Self {
        EffectError::Permanent(e.to_string())
    }

    /// A failure whose next call should wait `after`, as the upstream asked.
    pub fn retry_after(after: Duration, e: impl std::fmt::Display) -> Self {
        EffectError::RetryAfter { error: e.to_string(), after }
    }

    /// `from_status`, honouring the answer's `Retry-After` header (seconds, or an HTTP date)
    /// on a 429 or a 503: the next call waits what the upstream asked.
    ///
    /// ```
    /// use std::time::Duration;
    /// use durafiber_runtime::EffectError;
    ///
    /// let e = EffectError::from_response(429, Some("30"), "slow down");
    /// assert_eq!(e, EffectError::RetryAfter { error: "HTTP 429: slow down".into(), after: Duration::from_secs(30) });
    /// assert_eq!(EffectError::from_response(404, Some("30"), "gone"), EffectError::from_status(404, "gone"));
    /// ```
    pub fn from_response(status: u16, retry_after: Option<&str>, body: impl std::fmt::Display) -> Self {
        let asked = retry_after.and_then(|value| parse_retry_after(value, std::time::SystemTime::now()));
        match (status, asked) {
            (429 | 503, Some(after)) => {
                EffectError::RetryAfter { error: format!("HTTP {status}: {body}"), after }
            }
            _ => EffectError::from_status(status, body),
        }
    }

    /// An HTTP answer's class: a 4xx is permanent, but for 408 (timeout), 425 (too early) and
    /// 429 (too many requests), which are worth another call, as is everything else.
    pub fn from_status(status: u16, body: impl std::fmt::Display) -> Self {
        let text = format!("HTTP {status}: {body}");
        match status {
            408 | 425 | 429 => EffectError::Retryable(text),
            400..=499 => EffectError::Permanent(text),
            _ => EffectError::Retryable(text),
        }
    }
}

impl std::fmt::Display for EffectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EffectError::Retryable(e) => write!(f, "{e}"),
            EffectError::Permanent(e) => write!(f, "permanent: {e}"),
            EffectError::RetryAfter { error, after } => {
                write!(f, "{error} (asked to retry after {})", humantime::format_duration(*after))
            }
        }
    }
}

/// A `Retry-After` value: delay-seconds, or an HTTP date (from `now`); `None` if neither.
fn parse_retry_after(value: &str, now: std::time::SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

// No `std::error::Error` for `EffectError` itself: that keeps this blanket conversion
// coherent, so `?` turns any error into a retryable one.
impl<E: std::error::Error> From<E> for EffectError {
    fn from(e: E) -> Self {
        EffectError::Retryable(e.to_string())
    }
}

/// Full-jitter backoff before call `attempt + 1`: uniform in
/// `0..=min(backoff_max, backoff_initial × 2^(attempt-1))`.
fn retry_delay_ms(raw: &RawCtx, options: &EffectOptions, attempt: u32) -> u64 {
    let base = options.backoff_initial.as_millis() as u64;
    let cap = base
        .checked_shl(attempt.saturating_sub(1).min(16))
        .unwrap_or(u64::MAX)
        .min(options.backoff_max.as_millis() as u64);
    raw.shared.controls.jitter_between(0, cap)
}

pub(crate) async fn perform<Args, R, F, Fut>(
    raw: &mut RawCtx,
    effect_id: &str,
    args: Args,
    options: EffectOptions,
    hooks: &(impl ReceiptHooks<R> + Sync),
    mut f: F,
) -> Result<R, AgentError>
where
    Args: Serialize + Clone + Send,
    R: Serialize + DeserializeOwned + Send,
    F: FnMut(String, Args) -> Fut + Send,
    Fut: Future<Output = Result<R, EffectError>> + Send,
{
    check_effect(effect_id, &options)?;
    // An operator's pause holds the run here, before anything goes out.
    crate::pause::gate(raw).await?;
    let shared = raw.shared.clone();
    let run_id = raw.cell.run_id.clone();
    let key = keys::ledger(&run_id, effect_id);
    let entry = match enter(raw, effect_id, &args, &key, hooks).await? {
        Entered::Replayed(receipt) => return Ok(receipt),
        Entered::Entry(entry) => entry,
    };
    committer::reached(raw, (Boundary::AfterEffectPrepare, effect_id)).await;

    let mut calls = EffectSpan::start(raw, effect_id, &entry.idempotency_key);
    let mut last_error = String::new();
    for attempt in 1..=options.attempts {
        // A node past its self-fence deadline, or whose shard moved, starts no call: the
        // run's new owner makes it, with the same key.
        shared.ownership.check(&run_id)?;
        // Its turn in its named limit, held until the call returns.
        let turn = match &options.limit {
            Some(limit) => Some(crate::limit::acquire(raw, effect_id, limit).await?),
            None => None,
        };
        calls.calls = attempt;
        let call = trace::with_traceparent(calls.traceparent.clone(), || {
            f(entry.idempotency_key.clone(), args.clone())
        });
        let answer = answer_within(raw, call, options.timeout).await;
        drop(turn);
        match answer {
            Ok(receipt) => return committed(raw, effect_id, (key, entry), receipt, hooks, &mut calls).await,
            Err(EffectError::Permanent(error)) => {
                calls.end(raw, "rejected", Some(error.clone()));
                tracing::warn!(%run_id, effect_id, attempt, error, "effect call refused; not retried");
                shared.event(&run_id, "effect_rejected", format!("{effect_id}: {error}"));
                return Err(AgentError::EffectRejected { effect_id: effect_id.to_string(), error });
            }
            Err(failed @ (EffectError::Retryable(_) | EffectError::RetryAfter { .. })) => {
                last_error = wait_to_retry(raw, effect_id, &options, attempt, failed).await;
            }
        }
    }
    calls.end(raw, "failed", Some(last_error.clone()));
    shared.event(
        &run_id,
        "effect_exhausted",
        format!("{effect_id}: {} calls, last: {last_error}", options.attempts),
    );
    Err(AgentError::EffectFailed {
        effect_id: effect_id.to_string(),
        attempts: options.attempts,
        error: last_error,
    })
}

/// A call's answer committed as the effect's receipt, with the boundaries around it.
async fn committed<R: Serialize>(
    raw: &RawCtx,
    effect_id: &str,
    (key, entry): (Key<LedgerEntry>, LedgerEntry),
    mut receipt: R,
    hooks: &(impl ReceiptHooks<R> + Sync),
    calls: &mut EffectSpan,
) -> Result<R, AgentError> {
    committer::reached(raw, (Boundary::AfterEffectCall, effect_id)).await;
    hooks.before_commit(raw, &mut receipt)?;
    commit(raw, key, entry, &receipt).await?;
    calls.end(raw, "executed", None);
    committer::reached(raw, (Boundary::AfterEffectCommit, effect_id)).await;
    Ok(receipt)
}

/// An effect's id and policy, checked before anything else.
fn check_effect(effect_id: &str, options: &EffectOptions) -> Result<(), AgentError> {
    if options.attempts == 0 || options.backoff_initial > options.backoff_max {
        return Err(AgentError::fail(format!(
            "effect {effect_id}: attempts must be at least 1 and backoff_initial at most backoff_max"
        )));
    }
    tables::check_id("effect id", effect_id).map_err(AgentError::fail)
}

/// After a retryable failure of call `attempt`: logs it and, when the policy allows another
/// call, waits the upstream's own wait when it named one, else the policy's backoff. The
/// failure's text.
async fn wait_to_retry(
    raw: &RawCtx,
    effect_id: &str,
    options: &EffectOptions,
    attempt: u32,
    failed: EffectError,
) -> String {
    let delay = match &failed {
        EffectError::RetryAfter { after, .. } => (*after).min(limits::RETRY_AFTER_MAX),
        _ => Duration::from_millis(retry_delay_ms(raw, options, attempt)),
    };
    let error = match failed {
        EffectError::RetryAfter { error, .. }
        | EffectError::Retryable(error)
        | EffectError::Permanent(error) => error,
    };
    let run_id = &raw.cell.run_id;
    tracing::warn!(%run_id, effect_id, attempt, error, delay_ms = delay.as_millis() as u64, "effect call failed");
    if attempt < options.attempts {
        let sleep = clock::sleep(raw.shared.time.clock.as_ref(), delay);
        raw.shared.life.parked(raw.in_fiber, sleep).await;
    }
    error
}

/// One call's answer, within `timeout` when there is one (a timeout is a retryable failure).
async fn answer_within<R, Fut>(raw: &RawCtx, call: Fut, timeout: Option<Duration>) -> Result<R, EffectError>
where
    Fut: Future<Output = Result<R, EffectError>>,
{
    let shared = &raw.shared;
    let timed_out = |limit: Duration| {
        Err(EffectError::Retryable(format!("no answer within {}", humantime::format_duration(limit))))
    };
    match timeout {
        None => call.await,
        Some(limit) if shared.time.clock.is_virtual() => {
            // On a virtual clock the call is still real I/O: it is work in flight, which
            // virtual time waits for, and its deadline is on the real clock — so whether
            // it times out does not depend on how fast the machine moves virtual time.
            match tokio::time::timeout(limit, call).await {
                Ok(answer) => answer,
                Err(_) => timed_out(limit),
            }
        }
        Some(limit) => {
            // Waiting for an answer with a deadline is waiting on the clock: on a virtual
            // clock, time may move to the deadline meanwhile.
            // The deadline is set before the wait is parked, so a virtual clock sees it.
            // It is dropped only after the wait counts as work again (see `VirtualSleep`).
            let mut deadline = clock::sleep(shared.time.clock.as_ref(), limit);
            let bounded = async {
                tokio::select! {
                    answer = call => answer,
                    () = &mut deadline => timed_out(limit),
                }
            };
            shared.life.parked(raw.in_fiber, bounded).await
        }
    }
}

/// The span of an effect's calls in one entry of the fiber: from the first call to the
/// receipt's commit, or to the last failure. Its `traceparent` goes with each call.
struct EffectSpan {
    span_id: opentelemetry::trace::SpanId,
    traceparent: Option<String>,
    effect_id: String,
    key: String,
    start: Timestamp,
    calls: u32,
}

impl EffectSpan {
    fn start(raw: &RawCtx, effect_id: &str, key: &str) -> EffectSpan {
        let span_id = match raw.shared.obs.traces.is_on() {
            true => trace::fresh_span_id(),
            false => opentelemetry::trace::SpanId::INVALID,
        };
        EffectSpan {
            span_id,
            traceparent: raw.shared.obs.traces.traceparent(&raw.cell.run_id, span_id),
            effect_id: effect_id.to_string(),
            key: key.to_string(),
            start: raw.shared.now(),
            calls: 0,
        }
    }

    fn end(&self, raw: &RawCtx, outcome: &'static str, error: Option<String>) {
        raw.shared.obs.span(|| {
            raw.span_since(format!("effect {}", self.effect_id), self.start)
                .id(self.span_id)
                .client()
                .attr("durafiber.effect.id", self.effect_id.clone())
                .attr("durafiber.effect.key", self.key.clone())
                .attr("durafiber.effect.calls", i64::from(self.calls))
                .attr("durafiber.effect.outcome", outcome)
                .error(error)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_4xx_is_permanent_but_for_timeouts_and_rate_limits() {
        assert!(matches!(EffectError::from_status(422, "declined"), EffectError::Permanent(_)));
        assert!(matches!(EffectError::from_status(404, ""), EffectError::Permanent(_)));
        for retry in [408, 425, 429, 500, 503] {
            assert!(matches!(EffectError::from_status(retry, ""), EffectError::Retryable(_)), "{retry}");
        }
    }

    #[test]
    fn a_retry_after_is_read_as_seconds_or_as_an_http_date_and_only_on_429_and_503() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_445_412_480); // Wed, 21 Oct 2015 07:28:00 GMT
        assert_eq!(parse_retry_after(" 120 ", now), Some(Duration::from_secs(120)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:29:30 GMT", now), Some(Duration::from_secs(90)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("soon", now), None);
        let asked = EffectError::from_response(503, Some("7"), "maintenance");
        assert!(matches!(asked, EffectError::RetryAfter { after, .. } if after == Duration::from_secs(7)));
        assert!(matches!(EffectError::from_response(429, None, ""), EffectError::Retryable(_)));
        assert!(matches!(EffectError::from_response(500, Some("7"), ""), EffectError::Retryable(_)));
        assert!(matches!(EffectError::from_response(422, Some("7"), ""), EffectError::Permanent(_)));
    }

    #[test]
    fn any_error_converts_to_a_retryable_one_with_the_question_mark() {
        fn call() -> Result<(), EffectError> {
            Err(std::io::Error::other("connection reset"))?;
            Ok(())
        }
        assert_eq!(call(), Err(EffectError::Retryable("connection reset".into())));
    }
}
