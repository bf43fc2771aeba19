//! What a start may ask of its run: how durable its stashes are and what it may spend.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::records::BudgetLimits;

/// How durable a stash is when `stash` returns (§3.2). Effects and approvals are always `Sync`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DurabilityMode {
    /// Returns after the stash is on disk (fsync'd).
    #[default]
    Sync,
    /// Returns at once; durable within `flush_every`.
    Async,
    /// Written only when the fiber ends or waits.
    Exit,
}

/// A durability mode's name that is none of `sync`, `async`, `exit`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown durability mode {0:?} (sync, async, exit)")]
pub struct UnknownDurability(pub String);

impl DurabilityMode {
    /// The mode's name, as stored in a run's options.
    pub fn name(self) -> &'static str {
        match self {
            DurabilityMode::Sync => "sync",
            DurabilityMode::Async => "async",
            DurabilityMode::Exit => "exit",
        }
    }

    /// Parses `sync`, `async` or `exit`.
    pub fn parse(s: &str) -> Result<Self, UnknownDurability> {
        match s {
            "sync" => Ok(DurabilityMode::Sync),
            "async" => Ok(DurabilityMode::Async),
            "exit" => Ok(DurabilityMode::Exit),
            other => Err(UnknownDurability(other.to_string())),
        }
    }
}

/// What one run may spend before it stops at its next boundary with
/// `Escalated{budget: <which>}`; `None` is no limit. A run's budget is its own
/// (`RunOptions::budget`) over the runtime's (`RuntimeConfig::budget`), fixed at its start.
///
/// ```
/// use std::time::Duration;
/// use durafiber_api::Budget;
///
/// let budget = Budget { effects_max: Some(20), cost_units_max: Some(50_000), wall_time_max: Some(Duration::from_secs(3600)), ..Budget::default() };
/// assert_eq!(budget.or(Budget { recoveries_max: Some(3), ..Budget::default() }).recoveries_max, Some(3));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Budget {
    /// Effects the run may start (a re-entered effect with its key is not a new one).
    pub effects_max: Option<u32>,
    /// Cost units the run may charge with `ctx.charge`.
    pub cost_units_max: Option<u64>,
    /// Time from the run's start after which it starts nothing more.
    #[serde(with = "humantime_serde")]
    pub wall_time_max: Option<Duration>,
    /// Recoveries (fiber attempts after the first) the run may have.
    pub recoveries_max: Option<u32>,
}

impl Budget {
    /// Each limit of `self`, or else `defaults`'.
    pub fn or(self, defaults: Budget) -> Budget {
        Budget {
            effects_max: self.effects_max.or(defaults.effects_max),
            cost_units_max: self.cost_units_max.or(defaults.cost_units_max),
            wall_time_max: self.wall_time_max.or(defaults.wall_time_max),
            recoveries_max: self.recoveries_max.or(defaults.recoveries_max),
        }
    }

    /// The limits as stored, when there is at least one.
    pub fn limits(self) -> Option<BudgetLimits> {
        if self == Budget::default() {
            return None;
        }
        Some(BudgetLimits {
            effects_max: self.effects_max,
            cost_units_max: self.cost_units_max,
            wall_time_max_ms: self.wall_time_max.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            recoveries_max: self.recoveries_max,
        })
    }
}
