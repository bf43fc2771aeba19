//! Approvals that take more than one person (`ctx.request_approval_with`): a rule written
//! with the pause, each person's decision recorded with who made it and the hash they
//! quoted, and the pause decided — once — by the decision that meets the rule.
//!
//! Every decision is written under the run's inbound lock, its vote and (when it meets the
//! rule) the pause's decision in one batch: however the decisions are spread over crashes
//! and nodes, the rule is met by exactly one write, and the run continues once.

use std::time::Duration;

use durafiber_store::tables::{ApprovalRuleRecord, Decision, VoteRecord};
use serde::{Deserialize, Serialize};

/// Who must decide a pause, and how many of them (`ctx.request_approval_with`).
///
/// ```
/// use durafiber_runtime::{ApprovalRule, Reviewers};
///
/// // Two people of the finance team; one "no" declines.
/// let rule = ApprovalRule::of(2).from(Reviewers::Named(vec!["alice".into(), "bob".into(), "carol".into()]));
/// assert_eq!(rule.required, 2);
/// ```
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalRule {
    /// Approvals by different people that approve the pause (at least 1).
    pub required: u32,
    /// Who may decide (anyone, by default).
    #[serde(default)]
    pub from: Reviewers,
    /// When declines decline it (one decline, by default).
    #[serde(default)]
    pub decline: DeclineRule,
    /// Silence escalates the pause after this long; `None`: the runtime's `escalate_after`.
    #[serde(with = "humantime_serde", default)]
    #[cfg_attr(feature = "schemars", schemars(schema_with = "duration_text"))]
    pub escalate_after: Option<Duration>,
}

/// A duration as `humantime` reads it ("4h", "90s", "1day 2h"), or null: its JSON Schema.
#[cfg(feature = "schemars")]
fn duration_text(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    const UNIT: &str = "(nsec|ns|usec|us|msec|ms|seconds|second|sec|s|minutes|minute|min|m|hours|hour|hr|h|days|day|d|weeks|week|w|months|month|M|years|year|y)";
    let pattern = format!("^[0-9]{{1,6}}{UNIT}( [0-9]{{1,6}}{UNIT})*$");
    schemars::json_schema!({
        "type": ["string", "null"],
        "pattern": pattern,
        "description": "a duration: \"4h\", \"90s\", \"1day 2h\"",
    })
}

impl ApprovalRule {
    /// `required` approvals from anyone who may decide, one decline declines.
    pub fn of(required: u32) -> Self {
        ApprovalRule {
            required,
            from: Reviewers::Anyone,
            decline: DeclineRule::AnyDecline,
            escalate_after: None,
        }
    }

    /// Only these may decide.
    pub fn from(mut self, from: Reviewers) -> Self {
        self.from = from;
        self
    }

    /// When declines decline it.
    pub fn decline(mut self, decline: DeclineRule) -> Self {
        self.decline = decline;
        self
    }

    /// Silence escalates after `after`.
    pub fn escalate_after(mut self, after: Duration) -> Self {
        self.escalate_after = Some(after);
        self
    }

    /// The rule as stored; an error when it can never be met.
    pub(crate) fn stored(&self) -> Result<ApprovalRuleRecord, UnmeetableRule> {
        if self.required == 0 {
            return Err(UnmeetableRule::NoneRequired);
        }
        let (reviewers, role) = match &self.from {
            Reviewers::Anyone => (Vec::new(), None),
            Reviewers::Role(role) => (Vec::new(), Some(role.clone())),
            Reviewers::Named(names) => {
                let mut names = names.clone();
                names.sort();
                names.dedup();
                if names.len() < self.required as usize {
                    return Err(UnmeetableRule::TooFewReviewers {
                        required: self.required,
                        named: names.len(),
                    });
                }
                (names, None)
            }
        };
        Ok(ApprovalRuleRecord {
            required: self.required,
            reviewers,
            role,
            decline_by_majority: self.decline == DeclineRule::Majority,
        })
    }
}

/// An approval rule that could never be met.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnmeetableRule {
    /// It asks for no approval.
    #[error("an approval rule needs at least 1 approval")]
    NoneRequired,
    /// It asks for more approvals than it names reviewers.
    #[error("{required} approvals required from {named} named reviewers: it could never be approved")]
    TooFewReviewers {
        /// Approvals it asks for.
        required: u32,
        /// Reviewers it names.
        named: usize,
    },
}

/// Who may decide a pause with a rule.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reviewers {
    /// Anyone allowed to decide at all (the server's reviewers).
    #[default]
    Anyone,
    /// Only holders of this role (as the server names roles: `reviewer`, `operator`,
    /// `admin`; a higher role holds the lower ones).
    Role(String),
    /// Only these people, by name.
    Named(Vec<String>),
}

/// When declines decline a pause with a rule.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeclineRule {
    /// One decline declines it.
    #[default]
    AnyDecline,
    /// Declines decline it once the approvals can no longer reach `required`: among named
    /// reviewers, more declines than `reviewers - required`; otherwise `required` declines.
    Majority,
}

/// Who makes a decision: their name, and the roles they hold (a higher role lists the lower
/// ones too). The server passes the caller's token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decider {
    /// Their name: one person counts once.
    pub name: String,
    /// The roles they hold.
    pub roles: Vec<String>,
}

impl Decider {
    /// `name`, holding `roles`.
    pub fn new(name: impl Into<String>, roles: &[&str]) -> Self {
        Decider { name: name.into(), roles: roles.iter().map(|r| (*r).to_string()).collect() }
    }
}

/// Why `decider` may not decide under `rule`, if they may not.
pub(crate) fn refusal(rule: &ApprovalRuleRecord, decider: &Decider) -> Option<String> {
    if !rule.reviewers.is_empty() && !rule.reviewers.contains(&decider.name) {
        return Some(format!("{} is not among its reviewers ({})", decider.name, rule.reviewers.join(", ")));
    }
    match &rule.role {
        Some(role) if !decider.roles.contains(role) => {
            Some(format!("{} does not hold the role {role}", decider.name))
        }
        _ => None,
    }
}

/// Where the votes stand: approvals so far, and the decision once the rule is met.
pub(crate) struct Tally {
    pub approvals: u32,
    pub decision: Option<Decision>,
}

/// The rule applied to `votes`: the pause's decision once they meet it, saying who decided.
pub(crate) fn tally(rule: &ApprovalRuleRecord, votes: &[VoteRecord]) -> Tally {
    let names = |approved: bool| -> Vec<&str> {
        votes.iter().filter(|v| v.approved == approved).map(|v| v.by.as_str()).collect()
    };
    let (yes, no) = (names(true), names(false));
    let approvals = u32::try_from(yes.len()).unwrap_or(u32::MAX);
    let declines = u32::try_from(no.len()).unwrap_or(u32::MAX);
    let declines_needed = match (rule.decline_by_majority, rule.reviewers.len()) {
        (false, _) => 1,
        (true, 0) => rule.required,
        (true, n) => u32::try_from(n).unwrap_or(u32::MAX).saturating_sub(rule.required).saturating_add(1),
    };
    let decision = if approvals >= rule.required {
        Some(Decision { approved: true, comment: format!("approved by {}", yes.join(", ")) })
    } else if declines >= declines_needed {
        let why: Vec<String> = votes
            .iter()
            .filter(|v| !v.approved)
            .map(|v| if v.comment.is_empty() { v.by.clone() } else { format!("{}: {}", v.by, v.comment) })
            .collect();
        Some(Decision { approved: false, comment: format!("declined by {}", why.join("; ")) })
    } else {
        None
    };
    Tally { approvals, decision }
}

#[cfg(test)]
mod tests {
    use super::*;
    use durafiber_api::Timestamp;

    fn vote(by: &str, approved: bool) -> VoteRecord {
        VoteRecord {
            by: by.into(),
            approved,
            comment: String::new(),
            payload_hash: "h".into(),
            at_ms: Timestamp::from_millis(0),
        }
    }

    fn rule(required: u32, reviewers: &[&str], majority: bool) -> ApprovalRuleRecord {
        ApprovalRuleRecord {
            required,
            reviewers: reviewers.iter().map(|r| (*r).to_string()).collect(),
            role: None,
            decline_by_majority: majority,
        }
    }

    #[test]
    fn two_of_three_approve_at_the_second_approval_and_one_decline_declines() {
        let r = rule(2, &["alice", "bob", "carol"], false);
        assert!(tally(&r, &[vote("alice", true)]).decision.is_none());
        let done = tally(&r, &[vote("alice", true), vote("bob", true)]).decision.expect("decided");
        assert_eq!(done, Decision { approved: true, comment: "approved by alice, bob".into() });
        let no = tally(&r, &[vote("alice", true), vote("carol", false)]).decision.expect("declined");
        assert!(!no.approved && no.comment.contains("carol"));
    }

    #[test]
    fn by_majority_a_decline_counts_only_once_the_approvals_cannot_be_reached() {
        let r = rule(2, &["alice", "bob", "carol"], true);
        assert!(tally(&r, &[vote("carol", false)]).decision.is_none());
        assert!(!tally(&r, &[vote("carol", false), vote("bob", false)]).decision.expect("declined").approved);
        let anyone = rule(2, &[], true);
        assert!(tally(&anyone, &[vote("x", false)]).decision.is_none());
        assert!(!tally(&anyone, &[vote("x", false), vote("y", false)]).decision.expect("declined").approved);
    }

    #[test]
    fn a_rule_that_can_never_be_met_is_refused_and_only_its_reviewers_may_decide() {
        assert!(ApprovalRule::of(0).stored().is_err());
        let named = ApprovalRule::of(3).from(Reviewers::Named(vec!["a".into(), "b".into(), "a".into()]));
        assert!(named.stored().is_err());
        let r = rule(2, &["alice", "bob"], false);
        assert!(refusal(&r, &Decider::new("alice", &[])).is_none());
        assert!(refusal(&r, &Decider::new("mallory", &["admin"])).is_some());
        let by_role = ApprovalRule::of(1).from(Reviewers::Role("operator".into())).stored().expect("rule");
        assert!(refusal(&by_role, &Decider::new("olga", &["reviewer", "operator"])).is_none());
        assert!(refusal(&by_role, &Decider::new("rita", &["reviewer"])).is_some());
    }
}
