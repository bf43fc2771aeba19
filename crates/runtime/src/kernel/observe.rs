//! What a runtime tells the world about its runs: the event log, metrics, spans, the crash
//! hook tests stop at, and the secrets nothing it shows may hold.

use serde::Serialize;

use durafiber_store::RunId;

use crate::{
    boundary::Boundary,
    events::EventLog,
    json::{self, JsonError},
    metrics::Metrics,
    secret::Secrets,
    trace::{Ended, Traces},
};

/// Called at every committed boundary of a fiber with the run's id and the [`Boundary`].
/// Returning `true` evicts the run right there. Tests evict or crash at an exact boundary;
/// the drill's server stops at one to be killed.
pub type CrashHook = std::sync::Arc<dyn Fn(&RunId, &Boundary) -> bool + Send + Sync>;

pub(crate) struct Observability {
    pub metrics: Metrics,
    pub events: EventLog,
    /// Where the runs' spans go (nowhere unless traces are configured).
    pub traces: Traces,
    pub secrets: Secrets,
    pub crash_hook: Option<CrashHook>,
}

impl Observability {
    /// Sends the span `span` makes, secrets redacted; when traces are off, nothing is made.
    pub fn span<'a>(&self, span: impl FnOnce() -> Ended<'a>) {
        if self.traces.is_on() {
            self.traces.send(&self.secrets, span());
        }
    }

    /// `text` with every configured secret value replaced: what the runtime stores, logs
    /// and shows never holds one, even when an upstream echoes it back.
    pub fn redact(&self, text: String) -> String {
        if self.secrets.is_empty() { text } else { self.secrets.redact(&text) }
    }

    /// The canonical JSON of `value`, secrets redacted, and its hash: what a receipt or an
    /// approval payload is stored as. Serialized once when no secret is in it.
    pub fn redacted_with_hash<T: Serialize + ?Sized>(
        &self,
        value: &T,
    ) -> Result<(String, String), JsonError> {
        let value = serde_json::to_value(value).map_err(JsonError::from)?;
        if !self.secrets.is_empty() {
            let text = serde_json::to_string(&value).map_err(JsonError::from)?;
            let redacted = self.secrets.redact(&text);
            if redacted != text {
                let value: serde_json::Value = json::parse(&redacted)?;
                return json::canonical_with_hash(&value);
            }
        }
        json::canonical_with_hash(&value)
    }
}
