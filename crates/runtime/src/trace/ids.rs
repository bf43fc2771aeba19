//! A run's trace and span ids, derived from its run id, so that every process that ever
//! touches the run — after a crash, an eviction, on another node — adds to the same trace
//! and names the same parents without asking anyone; and W3C `traceparent` headers.

use durafiber_store::RunId;
use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
use sha2::{Digest, Sha256};

/// The trace of the run `run_id`: the first 16 bytes of SHA-256("durafiber/trace/v1" ‖ run id).
///
/// ```
/// use durafiber_runtime::{RunId, trace::trace_id_of};
///
/// let id = trace_id_of(&RunId::from("r-1"));
/// assert_eq!(id.len(), 32);
/// assert_eq!(id, trace_id_of(&RunId::from("r-1")));
/// ```
pub fn trace_id_of(run_id: &RunId) -> String {
    trace_id(run_id).to_string()
}

pub(crate) fn trace_id(run_id: &RunId) -> TraceId {
    let digest = Sha256::new().chain_update(b"durafiber/trace/v1").chain_update(run_id.as_bytes()).finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    if bytes == [0; 16] {
        bytes[15] = 1;
    }
    TraceId::from_bytes(bytes)
}

/// A span every process derives alike: the run's root (`what` "run") or a fiber attempt's.
pub(crate) fn span_id(seed: &str, what: &str, n: u64) -> SpanId {
    let digest = Sha256::new()
        .chain_update(b"durafiber/span/v1")
        .chain_update(seed.as_bytes())
        .chain_update([0u8])
        .chain_update(what.as_bytes())
        .chain_update(n.to_be_bytes())
        .finalize();
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    if bytes == [0; 8] {
        bytes[7] = 1;
    }
    SpanId::from_bytes(bytes)
}

/// The root span of the run's trace.
pub(crate) fn root_span_id(run_id: &RunId) -> SpanId {
    span_id(run_id, "run", 0)
}

/// The span of the run's fiber attempt `attempt`.
pub(crate) fn attempt_span_id(run_id: &RunId, attempt: u32) -> SpanId {
    span_id(run_id, "attempt", u64::from(attempt))
}

/// A span id no other span has.
pub(crate) fn fresh_span_id() -> SpanId {
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_err() || bytes == [0; 8] {
        // Without randomness, a counter still keeps this process's spans apart.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return span_id(&std::process::id().to_string(), "fresh", n);
    }
    SpanId::from_bytes(bytes)
}

/// `00-<trace id>-<span id>-01`: what a call made under `span` of the run's trace sends.
pub(crate) fn traceparent(trace_id: TraceId, span_id: SpanId) -> String {
    format!("00-{trace_id}-{span_id}-01")
}

/// A W3C `traceparent` header's span, or `None` if it is malformed: a bad header is ignored,
/// never an error (W3C Trace Context, §3.2).
pub fn parse_traceparent(header: &str) -> Option<SpanContext> {
    let mut parts = header.trim().split('-');
    let (version, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let lower_hex = |s: &str, len: usize| {
        s.len() == len && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    if !lower_hex(version, 2)
        || version == "ff"
        || !lower_hex(trace, 32)
        || !lower_hex(span, 16)
        || !lower_hex(flags, 2)
    {
        return None;
    }
    // Version 00 has exactly four fields; a later version may add some.
    if version == "00" && parts.next().is_some() {
        return None;
    }
    let trace_id = TraceId::from_hex(trace).ok()?;
    let span_id = SpanId::from_hex(span).ok()?;
    let flags = TraceFlags::new(u8::from_str_radix(flags, 16).ok()?);
    let context = SpanContext::new(trace_id, span_id, flags, true, TraceState::default());
    context.is_valid().then_some(context)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_the_same_in_every_process_and_differ_between_runs_and_attempts() {
        assert_eq!(trace_id(&RunId::from("r-1")), trace_id(&RunId::from("r-1")));
        assert_ne!(trace_id(&RunId::from("r-1")), trace_id(&RunId::from("r-2")));
        assert_eq!(attempt_span_id(&RunId::from("r-1"), 2), attempt_span_id(&RunId::from("r-1"), 2));
        assert_ne!(attempt_span_id(&RunId::from("r-1"), 1), attempt_span_id(&RunId::from("r-1"), 2));
        assert_ne!(root_span_id(&RunId::from("r-1")), attempt_span_id(&RunId::from("r-1"), 0));
        assert_ne!(fresh_span_id(), fresh_span_id());
    }

    #[test]
    fn a_traceparent_round_trips_and_a_malformed_one_is_ignored() {
        let header = traceparent(trace_id(&RunId::from("r-1")), root_span_id(&RunId::from("r-1")));
        let parsed = parse_traceparent(&header).expect("a header we wrote parses");
        assert_eq!(parsed.trace_id(), trace_id(&RunId::from("r-1")));
        assert_eq!(parsed.span_id(), root_span_id(&RunId::from("r-1")));
        assert!(parsed.is_sampled());
        for bad in [
            "",
            "00-abc",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
        ] {
            assert!(parse_traceparent(bad).is_none(), "{bad:?}");
        }
        assert!(parse_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01").is_some());
    }
}
