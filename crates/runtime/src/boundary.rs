//! The boundaries of a fiber that a crash hook, seeded chaos and the checker can stop at: a
//! committed stash, an effect's prepare, call and commit, an approval's request, a durable
//! sleep and an event wait. Each is written `kind:name` in logs and on the command line
//! (`after_effect_call:refund`), and parsed back from that.

use std::{fmt, str::FromStr};

/// A committed boundary of a fiber, the point where a real crash or eviction could hit.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Boundary {
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
    /// Right after this durable sleep's wake time was committed.
    AfterSleep(String),
    /// Right after a wait for this event was journaled, before the event came.
    AfterEventWait(String),
    /// Right after the event this wait got was journaled.
    AfterEvent(String),
}

/// Builds a boundary of one kind from its name.
type MakeBoundary = fn(String) -> Boundary;

/// Every kind of boundary, by the variant that holds its name (its written kind is `kind()`).
const KINDS: [MakeBoundary; 8] = [
    Boundary::AfterStash,
    Boundary::AfterEffectPrepare,
    Boundary::AfterEffectCall,
    Boundary::AfterEffectCommit,
    Boundary::AfterApprovalRequest,
    Boundary::AfterSleep,
    Boundary::AfterEventWait,
    Boundary::AfterEvent,
];

impl Boundary {
    /// The kind as it is written: `after_stash`, `after_effect_call`, ...
    pub fn kind(&self) -> &'static str {
        match self {
            Boundary::AfterStash(_) => "after_stash",
            Boundary::AfterEffectPrepare(_) => "after_effect_prepare",
            Boundary::AfterEffectCall(_) => "after_effect_call",
            Boundary::AfterEffectCommit(_) => "after_effect_commit",
            Boundary::AfterApprovalRequest(_) => "after_approval_request",
            Boundary::AfterSleep(_) => "after_sleep",
            Boundary::AfterEventWait(_) => "after_event_wait",
            Boundary::AfterEvent(_) => "after_event",
        }
    }

    /// The step, effect, approval, sleep or event it is after.
    pub fn name(&self) -> &str {
        match self {
            Boundary::AfterStash(n)
            | Boundary::AfterEffectPrepare(n)
            | Boundary::AfterEffectCall(n)
            | Boundary::AfterEffectCommit(n)
            | Boundary::AfterApprovalRequest(n)
            | Boundary::AfterSleep(n)
            | Boundary::AfterEventWait(n)
            | Boundary::AfterEvent(n) => n,
        }
    }
}

impl fmt::Display for Boundary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind(), self.name())
    }
}

/// A boundary that is not written `kind:name` with one of the known kinds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a boundary: {0:?} (expected after_stash:<step>, after_effect_call:<effect>, ...)")]
pub struct UnknownBoundary(pub String);

impl FromStr for Boundary {
    type Err = UnknownBoundary;

    fn from_str(s: &str) -> Result<Boundary, UnknownBoundary> {
        let (kind, name) = s.split_once(':').ok_or_else(|| UnknownBoundary(s.to_string()))?;
        KINDS
            .iter()
            .map(|make| make(name.to_string()))
            .find(|boundary| boundary.kind() == kind)
            .ok_or_else(|| UnknownBoundary(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_boundary_reads_back_as_it_is_written() {
        let mut kinds = std::collections::BTreeSet::new();
        for make in KINDS {
            let boundary = make("refund:2".into());
            assert!(kinds.insert(boundary.kind()), "{} is written once", boundary.kind());
            assert_eq!(boundary.to_string().parse::<Boundary>(), Ok(boundary));
        }
        assert!("after_lunch:x".parse::<Boundary>().is_err());
        assert!("after_stash".parse::<Boundary>().is_err());
    }
}
