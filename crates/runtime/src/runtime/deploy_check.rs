//! The check before a deploy: would this binary's agents carry every open run? Run with the
//! new code against the live store, it decodes what a recovery decodes before any of the
//! agent's code runs — each open run's input as the agent's `Input`, and its last stash as
//! its `Stash`, upgraded through `upgrade_stash` when older — and lists each run that would
//! escalate instead, with the reason. It reads only.
//!
//! Approval payloads, alarm payloads and event payloads are typed where the agent's code
//! reads them (`request_approval`, `on_alarm`, `wait_for_event`), not by the `Agent` trait:
//! they are not checked here.

use durafiber_store::{RunId, StoreError};
use serde::Serialize;

use super::handle::Runtime;
use crate::{error::RuntimeError, kernel::shared::Shared, kernel::stash_record};

/// An open run that the checked code would escalate at its next recovery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeployProblem {
    /// The run.
    pub run_id: RunId,
    /// Its kind.
    pub kind: String,
    /// Why the run would escalate.
    pub reason: String,
}

impl std::fmt::Display for DeployProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.run_id, self.kind, self.reason)
    }
}

impl Runtime {
    /// Every open run this runtime's agents would escalate at its next recovery, because its
    /// kind is not registered, its input does not decode as the agent's `Input`, or its
    /// last stash does not decode (or upgrade) as its `Stash`. Empty when every open run
    /// would be carried. Reads only; a panic in `upgrade_stash` is reported as the run's
    /// problem. Open the runtime [`passive`](crate::RuntimeBuilder::passive)ly to check a
    /// store without running anything.
    ///
    /// # Errors
    ///
    /// A store that cannot be read. A run whose record is unreadable is listed, not an error.
    pub fn check_deploy(&self) -> Result<Vec<DeployProblem>, RuntimeError> {
        check(&self.shared)
    }
}

fn check(shared: &Shared) -> Result<Vec<DeployProblem>, RuntimeError> {
    let mut problems = Vec::new();
    let mut after = None;
    loop {
        let (ids, next) = shared.open_runs_page(after.as_ref())?;
        for run_id in ids {
            if let Some(problem) = check_run(shared, &run_id)? {
                problems.push(problem);
            }
        }
        match next {
            Some(last) => after = Some(last),
            None => break,
        }
    }
    Ok(problems)
}

/// The reason `run_id` would escalate, if it would.
fn check_run(shared: &Shared, run_id: &RunId) -> Result<Option<DeployProblem>, RuntimeError> {
    let problem = |kind: &str, reason: String| {
        Ok(Some(DeployProblem { run_id: RunId::from(run_id), kind: kind.to_string(), reason }))
    };
    let run = match shared.load_run(run_id) {
        Ok(run) => run,
        Err(RuntimeError::UnknownRun { .. }) => return Ok(None),
        Err(RuntimeError::Store(e)) if unreadable(&e) => return problem("?", format!("record: {e}")),
        Err(e) => return Err(e),
    };
    if run.status.is_terminal() {
        return Ok(None);
    }
    let Ok(agent) = shared.agents.agent(&run.kind) else {
        return problem(&run.kind, "kind: not registered in this binary".into());
    };
    let input = serde_json::from_str::<serde_json::Value>(&run.input_json);
    if let Err(e) = input.and_then(|input| agent.check_input(&input)) {
        return problem(
            &run.kind,
            format!("input: the stored input does not decode as this code's Input: {e}"),
        );
    }
    let stored = match stash_record::read(&shared.store, run_id) {
        Ok(Some(stored)) => stored,
        Ok(None) => return Ok(None),
        Err(e) if unreadable(&e) => return problem(&run.kind, format!("stash: {e}")),
        Err(e) => return Err(e.into()),
    };
    // `upgrade_stash` is the agent's code: a panic in it is this run's problem.
    let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| agent.check_stash(&stored)));
    match checked {
        Ok(Ok(())) => Ok(None),
        Ok(Err(reason)) => problem(&run.kind, format!("stash: {reason}")),
        Err(panic) => {
            problem(&run.kind, format!("stash: upgrade_stash panicked: {}", crate::error::panic_text(panic)))
        }
    }
}

/// Bytes that stay unreadable whatever the code: the run's own problem, not the check's.
fn unreadable(e: &StoreError) -> bool {
    matches!(e, StoreError::Corrupt { .. } | StoreError::UnknownVersion { .. })
}
