//! What a run's actor is sent: one variant per inbound event.

use durafiber_api::Timestamp;
use durafiber_store::tables::RunRecord;
use ractor::RpcReplyPort;

use crate::{
    clock::Stopwatch,
    error::AgentError,
    hooks::{AlarmEvent, RecoveryReason},
    kernel::busy::BusyGuard,
};

/// One variant per inbound event.
pub(crate) enum RunMsg {
    /// Start or recover the fiber if the run needs one. The guard keeps virtual time still
    /// until the actor has handled it; `since` is when the runtime decided to re-enter the
    /// run, where recovery latency starts.
    /// `decided` is what a cold activation already decided and registered, from the one
    /// read of the run it made; `None` lets the actor read the run and decide.
    Activate { busy: BusyGuard, since: Stopwatch, decided: Option<Activation> },
    /// A message from outside, for `on_message`.
    Message { json: String, reply: RpcReplyPort<Result<(), AgentError>> },
    /// A request from outside, for `on_request`: the reply goes back as JSON text.
    Request { json: String, reply: RpcReplyPort<Result<String, AgentError>> },
    /// A due alarm, for `on_alarm`.
    Alarm { event: AlarmEvent, reply: RpcReplyPort<Result<(), AgentError>> },
}

/// What activation decided for a run that has no live fiber.
pub(crate) enum Activation {
    /// The fiber is registered (a boundary): run it.
    Start(Box<Registered>),
    /// Interrupted, but its recovery backoff runs until then.
    Later(Timestamp),
    /// A human must look, for this reason.
    Escalate(String),
    /// Waiting or finished: nothing to run.
    Nothing,
}

/// A fiber whose registration is durable: what it is handed, read once at activation.
pub(crate) struct Registered {
    /// The run as the registration wrote it.
    pub run: RunRecord,
    pub mode: FiberMode,
    /// The run's last stash, read with the record; an error is a corrupt stash.
    pub stash: super::stash_record::StashRead,
    /// A recovery's place at the hook gate, for the run's cell to hold until it settles.
    pub hook: Option<super::hook_gate::HookPermit>,
}

/// A fresh fiber (`run_fiber`) or a recovery (`on_fiber_recovered`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum FiberMode {
    Fresh,
    Recover(RecoveryReason),
}
