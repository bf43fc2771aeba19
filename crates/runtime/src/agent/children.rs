//! A fiber's children: runs it starts (`start_child`) and waits for (`join`).

use durafiber_store::tables::RunStatus;

use super::{Agent, Ctx};
use crate::{
    child::{self, Child},
    error::AgentError,
    json,
};

impl<A: Agent> Ctx<A> {
    /// Starts a child run of agent `B` under `name` (a sub-agent): durably, keyed under this
    /// run, so a re-entered fiber that starts it again gets the same run (with another input,
    /// `KeyConflict`). The child runs on its own — recovered, parked, evicted as any run — and
    /// [`Ctx::join`] waits for its end. Cancelling this run cancels its open children.
    /// Inspection, the API and the console show parent and children. Fiber only.
    ///
    /// ```no_run
    /// # use durafiber_runtime::{Agent, AgentError, Ctx};
    /// # struct Research; impl Agent for Research { const KIND: &'static str = "research"; type Input = String; type Stash = (); type Output = String; type Message = ();
    /// #   async fn run_fiber(&self, _: &mut Ctx<Self>, q: String) -> Result<String, AgentError> { Ok(q) } }
    /// # async fn plan<A: Agent>(ctx: &mut Ctx<A>) -> Result<(), AgentError> {
    /// let pricing = ctx.start_child::<Research>("pricing", &"competitor prices".to_string()).await?;
    /// let reviews = ctx.start_child::<Research>("reviews", &"what customers say".to_string()).await?;
    /// let (pricing, reviews) = (ctx.join(&pricing).await?, ctx.join(&reviews).await?);
    /// # let _ = (pricing, reviews); Ok(()) }
    /// ```
    pub async fn start_child<B: Agent>(
        &mut self,
        name: &str,
        input: &B::Input,
    ) -> Result<Child<B>, AgentError> {
        let input_json = json::canonical(input).map_err(|e| AgentError::Serialization(e.into()))?;
        let run_id = Box::pin(child::start(&self.raw, name, B::KIND, input_json)).await?;
        Ok(Child::new(run_id, name))
    }

    /// Waits durably for `child`'s end (the run is `Waiting{event}` meanwhile and may be
    /// parked or evicted) and returns its output, typed. A child that failed, was escalated
    /// or was cancelled is [`AgentError::ChildFailed`], for this fiber to handle — returned
    /// as is, it fails this run. Re-entered, it answers at once from the child's stored end.
    pub async fn join<B: Agent>(&mut self, child: &Child<B>) -> Result<B::Output, AgentError> {
        let status = Box::pin(child::join(&mut self.raw, child.run_id())).await?;
        let failed = |state: &str, detail: &str| AgentError::ChildFailed {
            name: child.name().to_string(),
            child: child.run_id().clone(),
            state: state.to_string(),
            detail: detail.to_string(),
        };
        match status {
            RunStatus::Completed { output_json } => {
                json::parse(&output_json).map_err(|e| AgentError::Serialization(e.into()))
            }
            RunStatus::Failed { error } => Err(failed("failed", &error)),
            RunStatus::Escalated { reason } => Err(failed("escalated", &reason)),
            RunStatus::Cancelled { reason } => Err(failed("cancelled", &reason)),
            other => Err(failed(other.name(), "ended in a state that is not an end")),
        }
    }
}
