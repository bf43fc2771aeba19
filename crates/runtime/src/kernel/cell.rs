//! One live run's in-memory side, and what its waits are woken with.

use durafiber_store::{RunId, lock::Mutex};
use std::sync::atomic::AtomicU64;

use tokio::sync::{Notify, oneshot};

use crate::{config::DurabilityMode, kernel::busy::WakeToken};

/// One live run's in-memory side: dropped on hibernation or eviction.
pub(crate) struct RunCell {
    pub run_id: RunId,
    pub kind: String,
    pub durability: DurabilityMode,
    pub fiber_keep_alive: bool,
    /// The fiber attempt the run is on, for the spans of its events.
    pub attempt: std::sync::atomic::AtomicU32,
    /// Last stash sequence number, shared by the fiber and event handlers.
    pub seq: AtomicU64,
    /// The cancellation signal the fiber sees.
    pub cancel: CancelSignal,
    /// What the fiber waits for in memory: a decision, an event.
    pub waits: Waits,
    /// The fiber's task and the recovery it is in.
    pub task: FiberTask,
    /// In `exit` durability, the stash that waits for the fiber to end or wait. Boxed: most
    /// runs never hold one, and every live run holds a cell.
    pub pending_exit: Mutex<Option<Box<super::stash_record::Stored>>>,
    /// Serializes the run's storage writes; holds its key count once read. Made at the
    /// first write, as the mailbox is at the first event: most live runs never need them.
    storage_keys: std::sync::OnceLock<Box<tokio::sync::Mutex<Option<usize>>>>,
    /// The run's actor slot.
    mailbox: std::sync::OnceLock<Box<super::mailbox::Mailbox>>,
    /// What the run emitted since its last boundary, and a streaming call's live chunks.
    pub output: CellOutput,
    /// What the run spent since its last boundary (`kernel/spend.rs`).
    pub spending: super::spend::CellSpending,
    /// The runs above this one (a sub-agent's parent, that one's parent…), nearest first:
    /// their pauses hold it and their budgets count its spending. Read once, when first
    /// needed; set empty at once for a run no run started (`without_parent`).
    pub lineage: std::sync::OnceLock<Box<[Ancestor]>>,
}

/// The waits of a fiber in memory. Boxed, as the stream is: every live run holds a cell,
/// and most never fill them.
pub(crate) struct Waits {
    /// A fiber waiting in `request_approval`: the approval id and where to send the decision.
    pub approval: Waiter<ApprovalOutcome>,
    /// A fiber waiting in `wait_for_event`: the event's name and where to say one came.
    pub event: Waiter<WakeToken>,
}

/// A run's fiber task as the runtime drives it.
pub(crate) struct FiberTask {
    /// The running fiber's task, aborted on eviction. The fiber's own task clears it as its
    /// last step, before it schedules any wake, so a wake never finds a finished fiber here.
    pub fiber: Mutex<Option<tokio::task::AbortHandle>>,
    /// A recovery was counted at registration and the fiber has committed no boundary since:
    /// an interruption the runtime itself causes now gives that count back (§3.6).
    pub recovering: std::sync::atomic::AtomicBool,
    /// The recovery hook's place at the hook gate, until the hook settles (first boundary,
    /// durable wait, end): see `kernel/hook_gate.rs`.
    pub hook: Mutex<Option<super::hook_gate::HookPermit>>,
    /// Set when the runtime evicts this cell. Its fiber's task is aborted, but an abort takes
    /// effect only at the task's next yield (and the task may be running right now): from
    /// here on anything that fiber still does writes nothing — the next cell owns the run.
    pub evicted: std::sync::atomic::AtomicBool,
}

/// A run's output between boundaries.
pub(crate) struct CellOutput {
    /// Output chunks emitted since the last boundary; `None` until the first emit of this
    /// activation reads the stream's head.
    pub stream: Mutex<Option<Box<super::stream_buffer::StreamBuffer>>>,
    /// The streaming effect whose call is running and what it sent, shown to readers before
    /// it is durable. Boxed: few runs are ever in one.
    pub live: Mutex<Option<Box<super::live_stream::LiveSlot>>>,
}

/// A fiber waiting for something named: the name, and where to send what came.
pub(crate) type Waiter<T> = Mutex<Option<Box<(String, oneshot::Sender<T>)>>>;

/// A run above another: its parent, or its parent's parent (sub-agents).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ancestor {
    pub run_id: RunId,
    pub kind: String,
}

/// A request to stop the run, and its reason, for the fiber to see. A `watch` channel did
/// this at the cost of some 400 bytes for each live run.
pub(crate) struct CancelSignal {
    reason: Mutex<Option<String>>,
    requested: Notify,
}

impl CancelSignal {
    /// Asks the fiber to stop, for `reason`.
    pub fn request(&self, reason: &str) {
        *self.reason.lock() = Some(reason.to_string());
        self.requested.notify_waiters();
    }

    pub fn reason(&self) -> Option<String> {
        self.reason.lock().clone()
    }

    pub fn is_requested(&self) -> bool {
        self.reason.lock().is_some()
    }

    /// Completes with the reason once the run is asked to stop.
    pub async fn requested(&self) -> String {
        loop {
            let notified = self.requested.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the reason is read, so a request after the read wakes it.
            notified.as_mut().enable();
            if let Some(reason) = self.reason() {
                return reason;
            }
            notified.await;
        }
    }
}

/// What a waiting `request_approval` is woken with.
pub(crate) enum ApprovalOutcome {
    /// The decision, and a token that keeps virtual time still until the fiber has resumed.
    Decided(durafiber_store::tables::Decision, WakeToken),
    Escalated,
}

impl RunCell {
    /// A cell with nothing waiting and no fiber.
    pub fn new(
        run_id: &RunId,
        kind: &str,
        durability: DurabilityMode,
        fiber_keep_alive: bool,
        attempt: u32,
        seq: u64,
        cancel_reason: Option<String>,
    ) -> Self {
        RunCell {
            run_id: run_id.clone(),
            kind: kind.to_string(),
            durability,
            fiber_keep_alive,
            attempt: std::sync::atomic::AtomicU32::new(attempt),
            seq: AtomicU64::new(seq),
            cancel: CancelSignal { reason: Mutex::new(cancel_reason), requested: Notify::new() },
            waits: Waits { approval: Mutex::new(None), event: Mutex::new(None) },
            task: FiberTask {
                fiber: Mutex::new(None),
                recovering: std::sync::atomic::AtomicBool::new(false),
                hook: Mutex::new(None),
                evicted: std::sync::atomic::AtomicBool::new(false),
            },
            pending_exit: Mutex::new(None),
            storage_keys: std::sync::OnceLock::new(),
            mailbox: std::sync::OnceLock::new(),
            output: CellOutput { stream: Mutex::new(None), live: Mutex::new(None) },
            spending: Default::default(),
            lineage: std::sync::OnceLock::new(),
        }
    }

    /// Says that no run is above this one (no run started it), so nothing reads its lineage.
    pub fn without_parent(self) -> Self {
        let _ = self.lineage.set(Box::default());
        self
    }

    /// The lock of the run's storage writes, with its key count once read.
    pub fn storage_keys(&self) -> &tokio::sync::Mutex<Option<usize>> {
        self.storage_keys.get_or_init(Box::default)
    }

    /// The run's actor slot (see [`Mailbox`](super::mailbox::Mailbox)).
    pub fn mailbox(&self) -> &super::mailbox::Mailbox {
        self.mailbox.get_or_init(Box::default)
    }

    pub fn fiber_running(&self) -> bool {
        self.task.fiber.lock().as_ref().is_some_and(|h| !h.is_finished())
    }
}

/// Which of `n` lock stripes `key` falls in.
pub(crate) fn stripe(key: &str, n: usize) -> usize {
    use std::hash::BuildHasher;
    (foldhash::fast::FixedState::default().hash_one(key) % n.max(1) as u64) as usize
}

/// Locks the stripes of `keys` in `locks`, in stripe order and each once. A free stripe is
/// taken without a wait's future: a recovery's batch locks hundreds of stripes twice, nearly
/// all free, and each wait also spent the task's scheduling budget. `try_lock` takes no
/// stripe that tasks queue for, so a waiting task is not overtaken.
pub(crate) async fn lock_stripes<'a>(
    locks: &'a [tokio::sync::Mutex<()>],
    keys: &[impl AsRef<str>],
) -> Vec<tokio::sync::MutexGuard<'a, ()>> {
    let mut stripes: Vec<usize> = keys.iter().map(|k| stripe(k.as_ref(), locks.len())).collect();
    stripes.sort_unstable();
    stripes.dedup();
    let mut guards = Vec::with_capacity(stripes.len());
    for i in stripes {
        let guard = match locks[i].try_lock() {
            Ok(guard) => guard,
            Err(_) => locks[i].lock().await,
        };
        guards.push(guard);
    }
    guards
}
