//! The outside world a checked agent calls, as the checker sees it: reset before each case,
//! counted after it. Asynchronous, so that an upstream behind a socket or a database is
//! asked as it is reached.

use std::{future::Future, pin::Pin};

use serde_json::Value;

use crate::{openai::FakeOpenAi, upstream::Upstream};

/// What a [`CheckUpstream`] answers with.
pub type UpstreamFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The outside world a checked agent calls: reset before each case, counted after it.
pub trait CheckUpstream: Send + Sync {
    /// Forgets every object.
    fn reset(&self) -> UpstreamFuture<'_, ()>;
    /// Every object created since the reset: `(collection, idempotency key, request body)`.
    fn objects(&self) -> UpstreamFuture<'_, Vec<(String, String, Value)>>;
    /// Every call since the reset, repeats with the same key included: `(collection,
    /// idempotency key)`. The fork cases read it to see an inherited effect called again;
    /// an upstream that cannot tell answers none.
    fn calls(&self) -> UpstreamFuture<'_, Vec<(String, String)>> {
        Box::pin(async { Vec::new() })
    }
}

impl CheckUpstream for Upstream {
    fn reset(&self) -> UpstreamFuture<'_, ()> {
        Box::pin(async move { Upstream::reset(self) })
    }

    fn calls(&self) -> UpstreamFuture<'_, Vec<(String, String)>> {
        Box::pin(async move { Upstream::calls(self) })
    }

    fn objects(&self) -> UpstreamFuture<'_, Vec<(String, String, Value)>> {
        Box::pin(async move {
            self.all()
                .into_iter()
                .map(|(collection, o)| {
                    let key = o["idempotency_key"].as_str().unwrap_or_default().to_string();
                    (collection, key, o["request"].clone())
                })
                .collect()
        })
    }
}

/// The checker counts completions: one object per idempotency key answered whole, and every
/// request with a key as a call.
impl CheckUpstream for FakeOpenAi {
    fn reset(&self) -> UpstreamFuture<'_, ()> {
        Box::pin(async move { FakeOpenAi::reset(self) })
    }

    fn objects(&self) -> UpstreamFuture<'_, Vec<(String, String, Value)>> {
        Box::pin(async move {
            let completed = self.completed_keys();
            let mut seen = std::collections::HashSet::new();
            self.recorded()
                .into_iter()
                .filter_map(|r| {
                    let key = r.idempotency_key?;
                    (completed.contains(&key) && !r.replayed && seen.insert(key.clone()))
                        .then(|| ("chat.completions".to_string(), key, r.body))
                })
                .collect()
        })
    }

    fn calls(&self) -> UpstreamFuture<'_, Vec<(String, String)>> {
        Box::pin(async move {
            self.recorded()
                .into_iter()
                .filter_map(|r| Some(("chat.completions".to_string(), r.idempotency_key?)))
                .collect()
        })
    }
}
