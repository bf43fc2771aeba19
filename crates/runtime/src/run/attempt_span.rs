//! The span of one fiber attempt, from the fiber's start to its end. Exactly one process
//! sends it:
//!
//! - the attempt itself, when it ends and the run settles or waits for nothing more;
//! - otherwise — its task dropped by an eviction, a park, a shutdown, or its process killed —
//!   the run's next attempt, as it starts (`left memory`). The next attempt comes whatever
//!   happened (the liveness rule), and knows the last one's number from the run record;
//! - or, for a run that settles without another attempt (escalated or cancelled from
//!   outside), that settlement.
//!
//! So a span sent under an attempt before a crash finds its parent, and no attempt is sent
//! twice. An attempt whose end scheduled a retry of the same run (an outage, a store fault)
//! leaves its span to the retry, which cannot tell it from an interrupted one.

use durafiber_api::Timestamp;
use std::sync::Arc;

use crate::{
    kernel::{cell::RunCell, inbox::FiberMode, shared::Shared},
    trace::{self, Ended, Parent},
};

pub(crate) struct AttemptSpan {
    shared: Arc<Shared>,
    cell: Arc<RunCell>,
    attempt: u32,
    mode: FiberMode,
    start: Timestamp,
}

impl AttemptSpan {
    /// The span of attempt `attempt`, starting now; first, the span of the attempt before
    /// it, if that one did not end by itself (see the module). A recovery is counted in
    /// `recover_attempts` when it registers: past one, the run is retrying a recovery hook
    /// that ended — and sent — by itself.
    pub fn start(
        shared: &Arc<Shared>,
        cell: &Arc<RunCell>,
        attempt: u32,
        mode: FiberMode,
        recover_attempts: u32,
    ) -> Option<AttemptSpan> {
        if !shared.obs.traces.is_on() {
            return None;
        }
        let before_ended_itself = matches!(mode, FiberMode::Recover(_)) && recover_attempts > 1;
        if attempt > 1 && !before_ended_itself {
            shared.send_unfinished_attempt(&cell.run_id, &cell.kind, attempt - 1, "left memory");
        }
        Some(AttemptSpan { shared: shared.clone(), cell: cell.clone(), attempt, mode, start: shared.now() })
    }

    /// Sends the span: the attempt ended with `outcome`, failing with `error` if it did.
    pub fn end(self, outcome: &'static str, error: Option<String>) {
        let (mode, reason) = match self.mode {
            FiberMode::Fresh => ("fresh", None),
            FiberMode::Recover(reason) => ("recover", Some(format!("{reason:?}").to_lowercase())),
        };
        let run_id = &self.cell.run_id;
        let mut span = Ended::new(run_id, &self.cell.kind, "fiber.attempt", Parent::Root)
            .id(trace::attempt_span_id(run_id, self.attempt))
            .times(self.start, self.shared.now())
            .attr("durafiber.attempt", i64::from(self.attempt))
            .attr("durafiber.fiber.mode", mode)
            .attr("durafiber.recovered", reason.is_some())
            .attr("durafiber.outcome", outcome)
            .error(error);
        if let Some(reason) = reason {
            span = span.attr("durafiber.recovery.reason", reason);
        }
        self.shared.obs.span(|| span);
    }
}
