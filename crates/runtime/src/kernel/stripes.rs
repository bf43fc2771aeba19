//! The locks that serialize work on one key at a time, striped so a lock costs no map:
//! starts per idempotency key, run records per run, and what arrives from outside per run.

use durafiber_store::RunId;
use tokio::sync::{Mutex, MutexGuard};

use crate::{kernel::cell::stripe, limits};

pub(crate) struct Stripes {
    /// Serializes `start` per idempotency key stripe, so two starts never both mint a run.
    pub starts: Vec<Mutex<()>>,
    /// Serializes read-modify-write of run records per run id stripe.
    pub runs: Vec<Mutex<()>>,
    /// Serializes what arrives from outside (decisions, events) per run id stripe, so two
    /// approvals or two sends of one run never both write.
    pub inbound: Vec<Mutex<()>>,
}

impl Stripes {
    pub fn new() -> Self {
        let locks = |n: usize| (0..n).map(|_| Mutex::new(())).collect();
        Stripes { starts: locks(64), runs: locks(limits::ACTIVATION_STRIPES), inbound: locks(64) }
    }

    /// The lock of starts under idempotency key `key`.
    pub async fn start(&self, key: &str) -> MutexGuard<'_, ()> {
        self.starts[stripe(key, self.starts.len())].lock().await
    }

    /// The lock that serializes decisions and events of `run_id`.
    pub async fn inbound(&self, run_id: &RunId) -> MutexGuard<'_, ()> {
        self.inbound[stripe(run_id, self.inbound.len())].lock().await
    }
}
