//! How long settled runs and audit entries are kept (`retention` in the config).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How long settled runs, and the audit trail's entries, are kept once they settled or were
/// written (`retention` in the config). Each unset kind is kept for ever, and so is everything
/// by default: deleting is the operator's choice. An open run is never deleted; an escalated
/// run waits for a human, so give it a retention only if someone looks in time.
///
/// ```
/// use durafiber_runtime::RuntimeConfig;
///
/// let config = RuntimeConfig::from_json(
///     r#"{"retention": {"completed": "30d", "failed": "90d", "cancelled": "30d", "audit": "400d"}}"#,
/// )?;
/// assert_eq!(config.retention.completed, Some(std::time::Duration::from_secs(30 * 86_400)));
/// assert_eq!(config.retention.escalated, None);
/// # Ok::<(), durafiber_runtime::RuntimeError>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Retention {
    /// Completed runs are deleted this long after they completed.
    #[serde(with = "humantime_serde")]
    pub completed: Option<Duration>,
    /// Failed runs, this long after they failed.
    #[serde(with = "humantime_serde")]
    pub failed: Option<Duration>,
    /// Cancelled runs, this long after they were cancelled.
    #[serde(with = "humantime_serde")]
    pub cancelled: Option<Duration>,
    /// Escalated runs, this long after they were escalated.
    #[serde(with = "humantime_serde")]
    pub escalated: Option<Duration>,
    /// Entries of the audit trail, this long after they were written.
    #[serde(with = "humantime_serde")]
    pub audit: Option<Duration>,
}

impl Retention {
    /// How long runs that settled `how` are kept; `None` for ever.
    pub fn of(&self, how: durafiber_store::tables::keys::Settled) -> Option<Duration> {
        use durafiber_store::tables::keys::Settled;
        match how {
            Settled::Completed => self.completed,
            Settled::Failed => self.failed,
            Settled::Cancelled => self.cancelled,
            Settled::Escalated => self.escalated,
        }
    }

    /// Whether anything is ever deleted.
    pub fn is_on(&self) -> bool {
        *self != Retention::default()
    }

    /// Each setting with its name in the config.
    pub fn settings(&self) -> [(&'static str, Option<Duration>); 5] {
        [
            ("completed", self.completed),
            ("failed", self.failed),
            ("cancelled", self.cancelled),
            ("escalated", self.escalated),
            ("audit", self.audit),
        ]
    }
}
