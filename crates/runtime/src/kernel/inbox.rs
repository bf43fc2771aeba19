//! What a run's actor is sent: one variant per inbound event.

use ractor::RpcReplyPort;

use crate::{clock::Stopwatch, error::AgentError, hooks::AlarmEvent, kernel::busy::BusyGuard};

/// One variant per inbound event.
pub(crate) enum RunMsg {
    /// Start or recover the fiber if the run needs one. The guard keeps virtual time still
    /// until the actor has handled it; `since` is when the runtime decided to re-enter the
    /// run, where recovery latency starts.
    Activate { busy: BusyGuard, since: Stopwatch },
    /// A message from outside, for `on_message`.
    Message { json: String, reply: RpcReplyPort<Result<(), AgentError>> },
    /// A request from outside, for `on_request`: the reply goes back as JSON text.
    Request { json: String, reply: RpcReplyPort<Result<String, AgentError>> },
    /// A due alarm, for `on_alarm`.
    Alarm { event: AlarmEvent, reply: RpcReplyPort<Result<(), AgentError>> },
}
