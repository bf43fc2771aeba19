//! The runtime's one error type, and the error an agent's code returns.

use durafiber_store::{RunId, StoreError};

/// What a caller of the runtime can get back. Variants name what to do next.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// No run has this id.
    #[error("unknown run id {run_id}")]
    UnknownRun {
        /// The id asked for.
        run_id: RunId,
    },
    /// Another node owns the run's shard (a store shared by several nodes): ask it.
    #[error("run {run_id} belongs to shard {shard}, which this node does not own")]
    NotOwner {
        /// The run.
        run_id: RunId,
        /// Its shard.
        shard: u32,
    },
    /// No agent of this kind is registered.
    #[error("unknown agent kind {kind:?}")]
    UnknownKind {
        /// The kind asked for.
        kind: String,
    },
    /// The run's agent does not take this message or request: it does not decode as the
    /// agent's `Message`.
    #[error("the {kind} agent does not take this message: {reason}")]
    WrongMessage {
        /// The run's agent kind.
        kind: String,
        /// Why it does not decode.
        reason: String,
    },
    /// The idempotency key was used before with another input.
    #[error("idempotency key {key:?} was used for run {run_id} with a different input")]
    KeyConflict {
        /// The key.
        key: String,
        /// The run it belongs to.
        run_id: RunId,
    },
    /// An approval quoted a payload hash that is not the pending one.
    #[error("stale approval for run {run_id}, approval {approval_id}: the payload hash does not match")]
    StaleApproval {
        /// The run.
        run_id: RunId,
        /// The approval.
        approval_id: String,
    },
    /// No pause with this id is waiting for a decision.
    #[error("approval {approval_id} of run {run_id} is not pending")]
    NotPending {
        /// The run.
        run_id: RunId,
        /// The approval.
        approval_id: String,
    },
    /// A different decision was already recorded.
    #[error("approval {approval_id} of run {run_id} was already decided differently")]
    AlreadyDecided {
        /// The run.
        run_id: RunId,
        /// The approval.
        approval_id: String,
    },
    /// This person has already decided this pause, differently: one person counts once.
    #[error("{by} has already decided approval {approval_id} of run {run_id}; one person counts once")]
    AlreadyVoted {
        /// The run.
        run_id: RunId,
        /// The approval.
        approval_id: String,
        /// Who.
        by: String,
    },
    /// The pause's rule does not let this person decide it.
    #[error("approval {approval_id} of run {run_id}: {reason}")]
    NotAReviewer {
        /// The run.
        run_id: RunId,
        /// The approval.
        approval_id: String,
        /// Why not.
        reason: String,
    },
    /// A pause that takes more than one person was decided without saying who decides
    /// (`Runtime::approve_as`).
    #[error("approval {approval_id} of run {run_id} takes more than one person: say who decides")]
    DeciderUnknown {
        /// The run.
        run_id: RunId,
        /// The approval.
        approval_id: String,
    },
    /// The run cannot be forked as asked: what its fork would need cannot be known.
    #[error("run {run_id} cannot be forked: {reason}")]
    ForkRefused {
        /// The run.
        run_id: RunId,
        /// Why not.
        reason: String,
    },
    /// The run has finished; it takes no more messages.
    #[error("run {run_id} has finished ({state})")]
    RunFinished {
        /// The run.
        run_id: RunId,
        /// Its terminal state.
        state: String,
    },
    /// The run is still open: only a settled run (completed, failed, cancelled, escalated)
    /// can be deleted.
    #[error("run {run_id} is still open ({state}); only a settled run can be deleted")]
    RunOpen {
        /// The run.
        run_id: RunId,
        /// Its state.
        state: String,
    },
    /// The run is a child of a run that still exists: it is deleted with its parent, whose
    /// `join` may still read it.
    #[error("run {run_id} is a child of run {parent}; it is deleted with its parent")]
    KeptWithParent {
        /// The run.
        run_id: RunId,
        /// The run that started it.
        parent: RunId,
    },
    /// The input, message or payload was refused.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A configuration value is wrong.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A durability mode's name is none of the three.
    #[error("invalid configuration: {0}")]
    Durability(#[from] durafiber_api::UnknownDurability),
    /// The operating system's cryptographic generator failed: an id that must not be
    /// guessable (a run id, an idempotency key) cannot be minted.
    #[error("the operating system gave no randomness for {what}")]
    NoRandomness {
        /// What was being minted.
        what: &'static str,
        /// The generator's own error.
        #[source]
        source: getrandom::Error,
    },
    /// The call needs a virtual clock.
    #[error("this runtime runs on the system clock; only a virtual clock can be advanced")]
    NotVirtual,
    /// An agent's handler failed.
    #[error("agent: {0}")]
    Agent(#[from] AgentError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The runtime is shutting down.
    #[error("the runtime is shutting down")]
    ShuttingDown,
    /// The run's fiber was evicted: what it still does writes nothing.
    #[error("run {run_id} was evicted from memory; its next activation owns it")]
    Evicted {
        /// The run.
        run_id: RunId,
    },

    /// Open runs that nothing will move (§3.7); [`crate::Runtime::advance`] checks after
    /// every call on a virtual clock.
    #[error("liveness: {}", violations.iter().map(std::string::ToString::to_string).collect::<Vec<_>>().join("; "))]
    LivenessViolation {
        /// Every run left behind.
        violations: Vec<LivenessViolation>,
    },
}

/// What an agent's code returns on failure. The runtime decides what each variant does to
/// the run: `Fail` fails it (or counts a failed recovery), `Escalate` hands it to a human.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
#[non_exhaustive]
pub enum AgentError {
    /// The step failed; a fresh fiber's run goes to `Failed`, a recovery counts an attempt.
    #[error("{0}")]
    Fail(String),
    /// A secret was asked for a destination it is not bound to (see `Ctx::secret_for`).
    #[error("secret {name} may not be sent to {destination}")]
    SecretRefused {
        /// The secret's name.
        name: String,
        /// Where it would have gone: `scheme://host:port`.
        destination: String,
    },
    /// A human must look.
    #[error("escalated: {0}")]
    Escalate(String),
    /// The run was cancelled; no new effect starts.
    #[error("cancelled: {0}")]
    Cancelled(String),
    /// Under `stop_calls` (a replay, as `check-deploy` runs one): the effect's call would have
    /// left the process and was not made. The run ends cancelled with this as its reason.
    #[error("replay stopped before effect {effect_id}'s call: {what}")]
    CallStopped {
        /// The effect.
        effect_id: String,
        /// What the call would have been.
        what: String,
    },
    /// The same effect id came with other arguments: the control flow diverged.
    #[error("effect {effect_id} was prepared with other arguments")]
    EffectConflict {
        /// The effect.
        effect_id: String,
    },
    /// The same approval id came with another payload.
    #[error("approval {approval_id} was requested with another payload")]
    ApprovalConflict {
        /// The approval.
        approval_id: String,
    },
    /// An effect named a limit (`EffectOptions::limit`) the runtime's config does not define.
    #[error("effect {effect_id} waits on limit {limit:?}, which the config's `limits` does not define")]
    UnknownLimit {
        /// The effect.
        effect_id: String,
        /// The limit it named.
        limit: String,
    },
    /// A child run (`Ctx::start_child`) ended without an output: it failed, was escalated or
    /// was cancelled. `Ctx::join` returns it for the parent to handle.
    #[error("child {name} ({child}) ended {state}: {detail}")]
    ChildFailed {
        /// The child's name among the parent's children.
        name: String,
        /// The child's run.
        child: RunId,
        /// `failed`, `escalated` or `cancelled`.
        state: String,
        /// Its error or reason.
        detail: String,
    },
    /// An effect failed on every attempt.
    #[error("effect {effect_id} failed after {attempts} attempts: {error}")]
    EffectFailed {
        /// The effect.
        effect_id: String,
        /// Calls made in this re-entry.
        attempts: u32,
        /// The last failure.
        error: String,
    },
    /// An effect's call answered with a permanent refusal (`EffectError::Permanent`, a 4xx
    /// say): not retried, and recovering the run will not change the answer.
    #[error("effect {effect_id} was refused: {error}")]
    EffectRejected {
        /// The effect.
        effect_id: String,
        /// The refusal.
        error: String,
    },
    /// The stash is larger than `stash_bytes_max`.
    #[error("stash of {bytes} bytes is over the limit of {max} bytes")]
    StashTooLarge {
        /// Its size.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// A storage call passed a limit: key bytes, value bytes, or keys in the run.
    #[error("storage: {size} {what} is over the limit of {max}")]
    StorageLimit {
        /// Which limit.
        what: &'static str,
        /// What the call would have made it.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// A handler (`on_message`, `on_request`, `on_alarm`) called `stash`: the fiber owns the
    /// stash, so that neither silently overwrites the other; handlers write `ctx.storage()`.
    #[error("a handler cannot stash: the fiber owns the stash; write ctx.storage() instead")]
    StashFromHandler,
    /// A handler called `emit`: the output stream is the fiber's, written with its boundaries.
    #[error("a handler cannot emit: the output stream is the fiber's")]
    EmitFromHandler,
    /// The run's output stream would pass `stream_bytes_max`; the chunk was not emitted.
    #[error("output stream of {bytes} bytes would pass the limit of {max} bytes")]
    StreamFull {
        /// What the stream would hold with the chunk.
        bytes: u64,
        /// The limit.
        max: u64,
    },
    /// A re-entered fiber emitted, at place `seq` of its stream, a chunk other than the one
    /// the stream holds there, under `strict_streams` (as `AgentCheck` runs): within one
    /// build, its code depends on something other than its stash. The run escalates.
    #[error(
        "output stream: chunk {seq} differs from the one the stream already holds; a re-entered \
         fiber must emit again what it emitted after its last stash (checked strictly here, as \
         `AgentCheck` does: within one build a different re-emission is a determinism bug; after \
         a deploy the runtime keeps the durable chunk and records the difference)"
    )]
    StreamDiverged {
        /// The chunk's place in the stream.
        seq: u64,
    },
    /// A value could not be encoded or decoded.
    #[error("serialization: {0}")]
    Serialization(String),
    /// The runtime could not write a boundary; the run will be recovered.
    #[error("runtime: {0}")]
    Runtime(String),
}

impl AgentError {
    /// A failure with a message: any error or text (`.map_err(AgentError::fail)`).
    pub fn fail(msg: impl std::fmt::Display) -> Self {
        AgentError::Fail(msg.to_string())
    }

    /// An escalation with a reason.
    pub fn escalate(reason: impl Into<String>) -> Self {
        AgentError::Escalate(reason.into())
    }
}

/// Lets agent code use `?` on runtime calls: refused input is the agent's failure, anything
/// else is the runtime's (the run will be recovered).
impl From<RuntimeError> for AgentError {
    fn from(e: RuntimeError) -> Self {
        match e {
            RuntimeError::InvalidInput(msg) => AgentError::Fail(msg),
            RuntimeError::Agent(inner) => inner,
            other => AgentError::Runtime(other.to_string()),
        }
    }
}

impl From<StoreError> for AgentError {
    fn from(e: StoreError) -> Self {
        AgentError::Runtime(e.to_string())
    }
}

/// An open run that nothing will move: no fiber, no durable wait, no wake.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LivenessViolation {
    /// The run left behind.
    pub run_id: RunId,
    /// Its stored state.
    pub status: durafiber_store::tables::RunStatus,
    /// Whether it is live in memory (without a fiber).
    pub live: bool,
}

impl std::fmt::Display for LivenessViolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let live = if self.live { "live actor, no fiber" } else { "not live" };
        write!(
            f,
            "run {} ({}, {live}) has no fiber, no durable wait and no wake",
            self.run_id,
            self.status.name()
        )
    }
}

/// Turns a panic's payload into text.
pub(crate) fn panic_text(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(std::string::ToString::to_string)
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".to_string())
}

/// A state's name that is none: invalid input, naming the states there are.
impl From<durafiber_api::UnknownState> for RuntimeError {
    fn from(e: durafiber_api::UnknownState) -> Self {
        RuntimeError::InvalidInput(e.to_string())
    }
}
