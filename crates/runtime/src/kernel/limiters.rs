//! The named limits of a runtime (`limits` in the config) as this process holds them: each
//! limit's local slots and token bucket, and which runs wait on one. `limit.rs` takes turns
//! in them.

use durafiber_api::Timestamp;
use durafiber_store::{RunId, lock::Mutex};
use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use serde::Serialize;
use tokio::sync::Semaphore;

use crate::config::NamedLimit;

/// Every named limit of a runtime, and which runs wait on one.
pub(crate) struct Limiters {
    pub by_name: HashMap<String, Arc<Limiter>>,
    /// The limit each waiting run waits on.
    pub waiting: Mutex<HashMap<RunId, String>>,
    /// This process's name among slot holders: a node's id and a random incarnation.
    pub holder: String,
    pub taken: AtomicU64,
}

pub(crate) struct Limiter {
    pub name: String,
    pub spec: NamedLimit,
    pub slots: Option<Arc<Semaphore>>,
    pub bucket: tokio::sync::Mutex<Bucket>,
    pub waiting: AtomicU64,
    pub in_flight: AtomicU64,
}

/// The local token bucket: tokens, and when they were counted.
pub(crate) struct Bucket {
    pub tokens: f64,
    pub at: Timestamp,
}

/// A limit's gauges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct LimitGauge {
    /// Calls waiting for their turn here.
    pub waiting: u64,
    /// Calls made now, from here.
    pub in_flight: u64,
}

impl Limiters {
    pub fn new(config: &BTreeMap<String, NamedLimit>, node: &str, now: Timestamp) -> Limiters {
        let by_name = config
            .iter()
            .map(|(name, spec)| {
                let limiter = Limiter {
                    name: name.clone(),
                    spec: *spec,
                    slots: spec.concurrency.map(|n| Arc::new(Semaphore::new(n as usize))),
                    // Empty at the start: a restart grants no burst the rate did not.
                    bucket: tokio::sync::Mutex::new(Bucket { tokens: 0.0, at: now }),
                    waiting: AtomicU64::new(0),
                    in_flight: AtomicU64::new(0),
                };
                (name.clone(), Arc::new(limiter))
            })
            .collect();
        let incarnation = crate::rng::unguessable_hex().unwrap_or_else(|_| format!("{:x}", now.as_millis()));
        Limiters {
            by_name,
            waiting: Mutex::new(HashMap::new()),
            holder: format!("{node}/{incarnation}"),
            taken: AtomicU64::new(0),
        }
    }

    /// The limit `run_id` waits on now, if any.
    pub fn waiting_on(&self, run_id: &RunId) -> Option<String> {
        self.waiting.lock().get(run_id).cloned()
    }

    /// Each limit's gauges, by name.
    pub fn gauges(&self) -> BTreeMap<String, LimitGauge> {
        self.by_name
            .values()
            .map(|l| {
                let gauge = LimitGauge {
                    waiting: l.waiting.load(Ordering::SeqCst),
                    in_flight: l.in_flight.load(Ordering::SeqCst),
                };
                (l.name.clone(), gauge)
            })
            .collect()
    }
}
