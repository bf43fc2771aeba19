//! What a check found: where each case crashed, how it ended, and what it did upstream, in
//! its stream and in its storage.

use std::{collections::BTreeMap, fmt};

use durafiber_runtime::{Boundary, Event, RunStatus};
use serde_json::Value;

use crate::SIM_EPOCH_MS;

/// Where a case crashes: at a boundary a dry run passed, or with a store write lost.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum CrashPoint {
    /// Right after this boundary was committed.
    At(Boundary),
    /// Store write number `n` (from the run's start), lost: the crash comes after it was
    /// applied and before its barrier.
    WriteLost(u64),
}

impl From<Boundary> for CrashPoint {
    fn from(boundary: Boundary) -> CrashPoint {
        CrashPoint::At(boundary)
    }
}

impl fmt::Display for CrashPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CrashPoint::At(Boundary::AfterStash(s)) => write!(f, "after stash {s:?}"),
            CrashPoint::At(Boundary::AfterEffectPrepare(s)) => write!(f, "after effect {s:?} was prepared"),
            CrashPoint::At(Boundary::AfterEffectCall(s)) => {
                write!(f, "after effect {s:?} was called, before its receipt")
            }
            CrashPoint::At(Boundary::AfterEffectCommit(s)) => write!(f, "after effect {s:?} was committed"),
            CrashPoint::At(Boundary::AfterApprovalRequest(s)) => {
                write!(f, "after approval {s:?} was requested")
            }
            CrashPoint::At(other) => write!(f, "at {other}"),
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
    /// A case called `name`, nothing found yet.
    pub(super) fn named(name: &str, crash_point: Option<CrashPoint>) -> Self {
        CaseReport {
            name: name.to_string(),
            crash_point,
            final_state: None,
            upstream: BTreeMap::new(),
            requests: Vec::new(),
            duplicated_effects: Vec::new(),
            missing_effects: Vec::new(),
            liveness_violations: Vec::new(),
            stream: Vec::new(),
            storage: BTreeMap::new(),
            problems: Vec::new(),
            events: Vec::new(),
        }
    }

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
            text.push_str(&format!(
                "  {} {} {}\n",
                e.at_ms.as_millis().saturating_sub(SIM_EPOCH_MS),
                e.kind,
                e.detail
            ));
        }
        panic!("{text}");
    }
}
