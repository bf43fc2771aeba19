//! A moment on the runtime's clock, as a type: [`Timestamp`]. Due times, deadlines and the
//! times records are stamped with are `Timestamp`s; spans of time are `std::time::Duration`s.
//! Only the wire and the store's keys see the milliseconds inside.

use std::{fmt, time::Duration};

use serde::{Deserialize, Serialize};

/// A moment on the runtime's clock: milliseconds since the Unix epoch.
///
/// On the wire and on disk it is that number (a field named `..._ms`); arithmetic on it is
/// checked or saturating, so a due time far in the future never wraps round to the past.
///
/// ```
/// use std::time::Duration;
/// use durafiber_api::Timestamp;
///
/// let asked = Timestamp::from_millis(1_000);
/// let due = asked.saturating_add(Duration::from_secs(2));
/// assert_eq!(due.as_millis(), 3_000);
/// assert_eq!(due.saturating_since(asked), Duration::from_secs(2));
/// assert_eq!(asked.saturating_since(due), Duration::ZERO);
/// ```
#[cfg_attr(
    feature = "openapi",
    derive(utoipa::ToSchema),
    schema(value_type = u64, description = "A moment on the runtime's clock: milliseconds since the Unix epoch.")
)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The Unix epoch: the time of a record that was never stamped.
    pub const ZERO: Timestamp = Timestamp(0);
    /// The last moment there is: a deadline that never comes.
    pub const MAX: Timestamp = Timestamp(u64::MAX);

    /// The moment `ms` milliseconds after the Unix epoch.
    pub const fn from_millis(ms: u64) -> Self {
        Timestamp(ms)
    }

    /// Milliseconds since the Unix epoch.
    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// `by` later, or `None` past the last moment there is.
    pub fn checked_add(self, by: Duration) -> Option<Self> {
        self.0.checked_add(millis(by)).map(Timestamp)
    }

    /// `by` later, or the last moment there is.
    pub fn saturating_add(self, by: Duration) -> Self {
        Timestamp(self.0.saturating_add(millis(by)))
    }

    /// `by` earlier, or the Unix epoch.
    pub fn saturating_sub(self, by: Duration) -> Self {
        Timestamp(self.0.saturating_sub(millis(by)))
    }

    /// How long after `earlier` this is; zero when it is not after it.
    pub fn saturating_since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }
}

/// Whole milliseconds of `d`, at most `u64::MAX`.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The milliseconds since the Unix epoch, as on the wire.
impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Serde for a `Duration` that the wire carries as whole milliseconds (a field named
/// `..._ms`): `#[serde(with = "durafiber_api::time::millis_duration")]`.
pub mod millis_duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes `d` as its whole milliseconds.
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(super::millis(*d))
    }

    /// Reads whole milliseconds.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn its_arithmetic_stays_within_time() {
        assert_eq!(Timestamp::MAX.checked_add(Duration::from_millis(1)), None);
        assert_eq!(Timestamp::MAX.saturating_add(Duration::MAX), Timestamp::MAX);
        assert_eq!(Timestamp::from_millis(5).saturating_sub(Duration::from_secs(1)), Timestamp::ZERO);
        assert_eq!(
            Timestamp::from_millis(7).checked_add(Duration::from_millis(3)),
            Some(Timestamp::from_millis(10))
        );
    }

    #[test]
    fn it_is_its_milliseconds_on_the_wire() {
        let json = serde_json::to_string(&Timestamp::from_millis(42)).unwrap_or_default();
        assert_eq!(json, "42");
        assert_eq!(serde_json::from_str::<Timestamp>("42").ok(), Some(Timestamp::from_millis(42)));
    }
}
