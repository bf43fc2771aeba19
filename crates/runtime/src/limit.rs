//! Named limits on effects' calls (`limits` in the config, `EffectOptions::limit`): an
//! effect's call waits its turn — a free concurrency slot, then a token of the rate — and
//! holds its slot until it returns.
//!
//! Turns are taken in the order calls came: the local slots are a fair semaphore, the local
//! bucket is behind a fair lock. On a store several nodes share, a call that has its local
//! turn also takes one of the limit's slots in the database (leased, renewed while the call
//! runs, expired if its node dies) and a token of the limit's bucket there, so the nodes
//! together make no more calls than the limit says. A waiting run is live: its fiber waits in
//! memory, counted here for inspection and `/metrics`.

use durafiber_store::RunId;
use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use tokio::sync::OwnedSemaphorePermit;

use crate::{
    clock,
    error::AgentError,
    kernel::{
        limiters::Limiter,
        shared::{RawCtx, Shared},
    },
    limits,
};

/// A call's turn in its limit: dropped when the call returns.
pub(crate) struct LimitPermit {
    limiter: Arc<Limiter>,
    _local: Option<OwnedSemaphorePermit>,
    shared: Option<SharedSlot>,
}

impl Drop for LimitPermit {
    fn drop(&mut self) {
        self.limiter.in_flight.fetch_sub(1, Ordering::SeqCst);
        if let Some(slot) = self.shared.take() {
            slot.release();
        }
    }
}

/// Counts a run as waiting on a limit while it lives.
struct Waiting<'a> {
    shared: &'a Shared,
    limiter: &'a Limiter,
    run_id: &'a RunId,
}

impl<'a> Waiting<'a> {
    fn new(shared: &'a Shared, limiter: &'a Limiter, run_id: &'a RunId) -> Self {
        limiter.waiting.fetch_add(1, Ordering::SeqCst);
        shared.controls.limiters.waiting.lock().insert(run_id.clone(), limiter.name.clone());
        Waiting { shared, limiter, run_id }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.limiter.waiting.fetch_sub(1, Ordering::SeqCst);
        self.shared.controls.limiters.waiting.lock().remove(self.run_id);
    }
}

/// Waits for effect `effect_id`'s turn in limit `name`.
pub(crate) async fn acquire(raw: &RawCtx, effect_id: &str, name: &str) -> Result<LimitPermit, AgentError> {
    let shared = &raw.shared;
    let Some(limiter) = shared.controls.limiters.by_name.get(name).cloned() else {
        return Err(AgentError::UnknownLimit { effect_id: effect_id.to_string(), limit: name.to_string() });
    };
    let run_id = &raw.cell.run_id;
    let waiting = Waiting::new(shared, &limiter, run_id);
    let began = shared.now();
    let local = match &limiter.slots {
        Some(slots) => {
            let permit = shared.life.parked(raw.in_fiber, slots.clone().acquire_owned()).await;
            Some(permit.map_err(|_| AgentError::fail(format!("limit {name} was closed")))?)
        }
        None => None,
    };
    let slot = match (limiter.spec.concurrency, shared.store.backend().shared_limits()) {
        (Some(slots), Some(_)) => Some(take_shared_slot(raw, &limiter.name, slots).await?),
        _ => None,
    };
    if let Some(rate) = limiter.spec.rate {
        take_token(raw, &limiter, rate.per_sec(), rate.burst()).await?;
    }
    drop(waiting);
    limiter.in_flight.fetch_add(1, Ordering::SeqCst);
    let waited_ms = shared.now().saturating_since(began).as_millis();
    if waited_ms > 0 {
        shared.event(run_id, "limit_waited", format!("{effect_id}: {waited_ms} ms for limit {name}"));
    }
    tracing::debug!(%run_id, effect_id, limit = name, waited_ms, "an effect's call has its turn");
    Ok(LimitPermit { limiter, _local: local, shared: slot })
}

/// A token of the limit's bucket: the database's when nodes share the store, else the local
/// one, waited for behind a fair lock so that calls take tokens in the order they came.
async fn take_token(raw: &RawCtx, limiter: &Limiter, per_sec: f64, burst: f64) -> Result<(), AgentError> {
    let shared = &raw.shared;
    let mut bucket = shared.life.parked(raw.in_fiber, limiter.bucket.lock()).await;
    loop {
        let wait = if shared.store.backend().shared_limits().is_some() {
            let (store, name) = (shared.store.clone(), limiter.name.clone());
            blocking(move || match store.backend().shared_limits() {
                Some(l) => l.take_token(&name, per_sec, burst),
                None => Ok(None),
            })
            .await?
        } else {
            let now = shared.now();
            let elapsed = now.saturating_since(bucket.at).as_secs_f64();
            bucket.tokens = (bucket.tokens + elapsed * per_sec).min(burst);
            bucket.at = now;
            if bucket.tokens >= 1.0 {
                bucket.tokens -= 1.0;
                None
            } else {
                Some(Duration::from_secs_f64(((1.0 - bucket.tokens) / per_sec).min(3_600.0)))
            }
        };
        let Some(wait) = wait else { return Ok(()) };
        // At least a millisecond: the clock counts in them.
        let wait = wait.max(Duration::from_millis(1));
        shared.life.parked(raw.in_fiber, clock::sleep(shared.time.clock.as_ref(), wait)).await;
    }
}

/// One of the limit's slots in the database, asked for until one is free.
async fn take_shared_slot(raw: &RawCtx, name: &str, slots: u32) -> Result<SharedSlot, AgentError> {
    let shared = &raw.shared;
    let n = shared.controls.limiters.taken.fetch_add(1, Ordering::SeqCst);
    let holder = format!("{}/{n}", shared.controls.limiters.holder);
    loop {
        let (store, lname, h) = (shared.store.clone(), name.to_string(), holder.clone());
        let slot = blocking(move || match store.backend().shared_limits() {
            Some(l) => l.take_slot(&lname, slots, &h, limits::LIMIT_SLOT_TTL),
            None => Ok(None),
        })
        .await?;
        if let Some(slot) = slot {
            return Ok(SharedSlot::hold(raw.shared.clone(), name, slot, holder));
        }
        shared.life.parked(raw.in_fiber, tokio::time::sleep(limits::LIMIT_SLOT_POLL)).await;
    }
}

/// A slot held in the database: renewed while held, given back when dropped.
struct SharedSlot {
    shared: Arc<Shared>,
    name: String,
    slot: u32,
    holder: String,
    renewer: tokio::task::JoinHandle<()>,
}

impl SharedSlot {
    fn hold(shared: Arc<Shared>, name: &str, slot: u32, holder: String) -> SharedSlot {
        let renewer = tokio::spawn({
            let (shared, name, holder) = (shared.clone(), name.to_string(), holder.clone());
            async move {
                loop {
                    tokio::time::sleep(limits::LIMIT_SLOT_TTL / 3).await;
                    let (store, n, h) = (shared.store.clone(), name.clone(), holder.clone());
                    let renewed = blocking(move || match store.backend().shared_limits() {
                        Some(l) => l.renew_slot(&n, slot, &h, limits::LIMIT_SLOT_TTL),
                        None => Ok(true),
                    })
                    .await;
                    if !matches!(renewed, Ok(true)) {
                        tracing::warn!(limit = name, slot, "a limit's slot was lost while its call ran");
                        return;
                    }
                }
            }
        });
        SharedSlot { shared, name: name.to_string(), slot, holder, renewer }
    }

    fn release(self) {
        self.renewer.abort();
        let SharedSlot { shared, name, slot, holder, .. } = self;
        let store = shared.store.clone();
        shared.life.spawn_tracked(async move {
            let released = blocking(move || match store.backend().shared_limits() {
                Some(l) => l.release_slot(&name, slot, &holder),
                None => Ok(()),
            })
            .await;
            if let Err(e) = released {
                // Its lease expires instead.
                tracing::warn!(error = %e, "a limit's slot could not be given back");
            }
        });
    }
}

/// Runs a call to the store's blocking interface off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, durafiber_store::StoreError> + Send + 'static,
) -> Result<T, AgentError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(result) => result.map_err(|e| AgentError::from(crate::error::RuntimeError::from(e))),
        Err(e) => Err(AgentError::fail(format!("a limit's call to the store failed: {e}"))),
    }
}
