//! What a check found: where each case crashed, how it ended, and what it did upstream, in
//! its stream and in its storage.

use std::{collections::BTreeMap, fmt};

use durafiber_runtime::{Event, RunStatus};
use serde_json::Value;

use crate::SIM_EPOCH_MS;

/// Where a case crashes, named after the boundary a dry run passed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum CrashPoint {
    /// Right after the stash at this step was committed.
    AfterStash(String),
    /// Right after this effect's idempotency key was committed, before its call.
    AfterEffectPrepare(String),
    /// After this effect's call returned, before its receipt was committed.
    AfterEffectCall(String),
    /// Right after this effect's receipt was committed.
    AfterEffectCommit(String),
    /// Right after this approval's pause was committed.
    AfterApprovalRequest(String),
    /// Another named boundary.
    Other(String),
    /// Store write number `n` (from the run's start), lost: the crash comes after it was
    /// applied and before its barrier.
    WriteLost(u64),
}

impl CrashPoint {
    /// The point named `after_stash:<step>`, `after_effect_prepare:<id>`, ... by the runtime.
    pub fn parse(name: &str) -> CrashPoint {
        let (kind, arg) = name.split_once(':').unwrap_or((name, ""));
        let arg = arg.to_string();
        match kind {
            "after_stash" => CrashPoint::AfterStash(arg),
            "after_effect_prepare" => CrashPoint::AfterEffectPrepare(arg),
            "after_effect_call" => CrashPoint::AfterEffectCall(arg),
            "after_effect_commit" => CrashPoint::AfterEffectCommit(arg),
            "after_approval_request" => CrashPoint::AfterApprovalRequest(arg),
            _ => CrashPoint::Other(name.to_string()),
        }
    }
}

impl fmt::Display for CrashPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CrashPoint::AfterStash(s) => write!(f, "after stash {s:?}"),
            CrashPoint::AfterEffectPrepare(s) => write!(f, "after effect {s:?} was prepared"),
            CrashPoint::AfterEffectCall(s) => write!(f, "after effect {s:?} was called, before its receipt"),
            CrashPoint::AfterEffectCommit(s) => write!(f, "after effect {s:?} was committed"),
            CrashPoint::AfterApprovalRequest(s) => write!(f, "after approval {s:?} was requested"),
            CrashPoint::Other(s) => write!(f, "at {s}"),
            CrashPoint::WriteLost(n) => write!(f, "with store write {n} lost before its barrier"),
        }
    }
}

/// One case's outcome.
#[derive(Debug, Clone)]
pub struct CaseReport {
    /// What was done to the run.
    pub name: String,
    /// Where it crashed, for a crash case.
    pub crash_point: Option<CrashPoint>,
    /// The run's final state; `None` if it did not finish within the time limit.
    pub final_state: Option<RunStatus>,
    /// Upstream objects per idempotency key.
    pub upstream: BTreeMap<String, usize>,
    /// Every upstream request, `(collection, request body)`, in the order made.
    pub requests: Vec<(String, Value)>,
    /// Upstream requests made more than once under different keys, or not made at all by
    /// the baseline: `(collection, request body)`.
    pub duplicated_effects: Vec<(String, Value)>,
    /// Upstream requests the baseline made that this case did not.
    pub missing_effects: Vec<(String, Value)>,
    /// Runs the liveness rule found left behind while the case ran.
    pub liveness_violations: Vec<String>,
    /// The run's output stream at its end, each chunk as JSON text.
    pub stream: Vec<String>,
    /// The run's storage at its end: keys and values as JSON text.
    pub storage: BTreeMap<String, String>,
    /// What went wrong, in words; empty when the case passed.
    pub problems: Vec<String>,
    /// The runtime's event log of the case's last process.
    pub events: Vec<Event>,
}

impl CaseReport {
    /// No problem found.
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Every case of a check, beside the uninterrupted run.
#[derive(Debug, Clone)]
pub struct CheckReport {
    /// The run with nothing done to it.
    pub baseline: CaseReport,
    /// Every other case, in the order run.
    pub cases: Vec<CaseReport>,
}

impl CheckReport {
    /// The cases with a problem, the baseline first if it has one.
    pub fn failures(&self) -> Vec<&CaseReport> {
        std::iter::once(&self.baseline).chain(&self.cases).filter(|c| !c.ok()).collect()
    }

    /// Panics, readably, unless every case passed: each failing case's problems, and the
    /// event log of the first.
    pub fn assert_ok(&self) {
        let failures = self.failures();
        let Some(first) = failures.first() else { return };
        let mut text = format!("{} of {} cases failed:\n", failures.len(), self.cases.len() + 1);
        for case in &failures {
            text.push_str(&format!("- {}:\n", case.name));
            for problem in &case.problems {
                text.push_str(&format!("    {problem}\n"));
            }
        }
        text.push_str(&format!(
            "\nbaseline: {:?}\nevents of \"{}\":\n",
            self.baseline.final_state, first.name
        ));
        for e in &first.events {
            text.push_str(&format!("  {} {} {}\n", e.at_ms.saturating_sub(SIM_EPOCH_MS), e.kind, e.detail));
        }
        panic!("{text}");
    }
}
