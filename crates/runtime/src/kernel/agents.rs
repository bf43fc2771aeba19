//! The agent kinds a runtime hosts, with their types erased to JSON, and the two ways a
//! feature below the runs layer has a run entered: re-activated, or started as a child.

use std::{collections::HashMap, future::Future, sync::Arc};

use durafiber_store::RunId;

use crate::{
    clock::Stopwatch,
    error::{AgentError, RuntimeError},
    hooks::{AlarmEvent, ExhaustedAction, RecoveryReason},
    kernel::shared::{RawCtx, Shared},
};

pub(crate) struct Agents {
    pub kinds: HashMap<String, Arc<dyn ErasedAgent>>,
    /// Re-enters a run: activates it and lets its actor start or recover the fiber. The
    /// runtime points it at the runs layer (`run/actor.rs`) when it opens, so that a
    /// feature below that layer can have a run re-entered without importing it.
    pub reactivator: Reactivator,
    /// Starts a run as a start through the runtime does — durably, idempotent by its key,
    /// then activated — for a fiber starting a child (`Ctx::start_child`); pointed at the
    /// runs layer as `reactivator` is.
    pub starter: Starter,
}

/// See [`Agents::reactivator`].
pub(crate) type Reactivator = fn(Arc<Shared>, String, Stopwatch) -> BoxFuture<()>;

/// See [`Agents::starter`]: (kind, idempotency key, input JSON) → the run's id.
pub(crate) type Starter = fn(Arc<Shared>, String, String, String) -> BoxFuture<Result<RunId, RuntimeError>>;

impl Agents {
    pub fn agent(&self, kind: &str) -> Result<Arc<dyn ErasedAgent>, RuntimeError> {
        self.kinds.get(kind).cloned().ok_or_else(|| RuntimeError::UnknownKind { kind: kind.to_string() })
    }
}

pub(crate) type BoxFuture<T> = std::pin::Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// What the runtime needs to recover a run, as stored.
pub(crate) struct RawRecovered {
    pub run_id: RunId,
    pub kind: String,
    pub stash: Option<super::stash_record::Stored>,
    pub input_json: String,
    pub attempt: u32,
    pub reason: RecoveryReason,
    pub created_at_ms: u64,
}

/// An agent with its types erased to JSON, so one runtime can host many kinds.
pub(crate) trait ErasedAgent: Send + Sync + 'static {
    /// Whether `input` is the agent's `Input`; why not otherwise.
    fn check_input(&self, input: &serde_json::Value) -> Result<(), String>;
    /// Whether `stored` decodes as the agent's `Stash`, upgraded when older, as a recovery
    /// would decode it; the reason it would escalate otherwise.
    fn check_stash(&self, stored: &super::stash_record::Stored) -> Result<(), String>;
    fn check_message(&self, message_json: &str) -> Result<(), String>;
    fn run_fiber(&self, ctx: RawCtx, input_json: String) -> BoxFuture<Result<String, AgentError>>;
    fn recover(&self, ctx: RawCtx, recovered: RawRecovered) -> BoxFuture<Result<String, AgentError>>;
    fn on_alarm(&self, ctx: RawCtx, alarm: AlarmEvent) -> BoxFuture<Result<(), AgentError>>;
    fn on_message(&self, ctx: RawCtx, message_json: String) -> BoxFuture<Result<(), AgentError>>;
    fn on_request(&self, ctx: RawCtx, message_json: String) -> BoxFuture<Result<String, AgentError>>;
    fn on_alarm_exhausted(&self, ctx: RawCtx, alarm: &AlarmEvent) -> ExhaustedAction;
    fn on_escalate(&self, ctx: RawCtx, reason: String) -> BoxFuture<()>;
    fn approval_view(
        &self,
        approval_id: &str,
        payload: &serde_json::Value,
    ) -> Option<crate::approval_view::ApprovalView>;
    fn input_schema(&self) -> Option<serde_json::Value>;
}
