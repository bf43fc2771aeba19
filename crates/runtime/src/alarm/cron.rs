//! Cron schedules: when an expression next fires, in UTC or in an IANA time zone.
//!
//! Parsing and the calendar arithmetic are `croner`'s (five fields, or six with seconds first;
//! names of days and months; `L`, `#`, `W`); time zones are `chrono-tz`'s, so a daily
//! `0 9 * * *` in `Europe/Berlin` stays at nine o'clock local time across daylight saving.

use durafiber_api::Timestamp;
use std::str::FromStr;

use chrono::{DateTime, TimeZone, Utc};
use croner::Cron;
use durafiber_store::tables::CronRecord;

use crate::error::RuntimeError;

/// A cron expression and the time zone it is read in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CronSchedule {
    pub(crate) expr: String,
    pub(crate) time_zone: Option<String>,
}

impl CronSchedule {
    /// Parses `expr` (read in UTC), refusing one that does not parse or never fires.
    pub fn parse(expr: &str) -> Result<Self, RuntimeError> {
        let schedule = CronSchedule { expr: expr.trim().to_string(), time_zone: None };
        schedule.check()?;
        Ok(schedule)
    }

    /// The same schedule read in IANA time zone `zone` (`Europe/Berlin`, `America/New_York`).
    pub fn in_time_zone(self, zone: &str) -> Result<Self, RuntimeError> {
        let schedule = CronSchedule { time_zone: Some(zone.to_string()), ..self };
        schedule.check()?;
        Ok(schedule)
    }

    /// Every time zone name `in_time_zone` takes (the IANA database).
    pub fn time_zone_names() -> impl Iterator<Item = &'static str> {
        chrono_tz::TZ_VARIANTS.iter().map(|tz| tz.name())
    }

    /// The expression, as given.
    pub fn expr(&self) -> &str {
        &self.expr
    }

    /// The time zone; `None` is UTC.
    pub fn time_zone(&self) -> Option<&str> {
        self.time_zone.as_deref()
    }

    fn check(&self) -> Result<(), RuntimeError> {
        next_after(&self.record(), Timestamp::ZERO).map(drop)
    }

    pub(crate) fn record(&self) -> CronRecord {
        CronRecord { expr: self.expr.clone(), time_zone: self.time_zone.clone() }
    }
}

/// The first time `cron` fires strictly after `after`.
pub(crate) fn next_after(cron: &CronRecord, after: Timestamp) -> Result<Timestamp, RuntimeError> {
    let invalid = |why: String| RuntimeError::InvalidInput(format!("cron expression {:?}: {why}", cron.expr));
    let parsed = Cron::from_str(&cron.expr).map_err(|e| invalid(e.to_string()))?;
    let after_ms = after.as_millis();
    let after = i64::try_from(after_ms)
        .ok()
        .and_then(|ms| Utc.timestamp_millis_opt(ms).single())
        .ok_or_else(|| invalid(format!("{after_ms} ms is not a time")))?;
    let next_ms = match &cron.time_zone {
        None => next_in(&parsed, &after),
        Some(zone) => {
            let tz = chrono_tz::Tz::from_str(zone)
                .map_err(|_| invalid(format!("{zone:?} is not an IANA time zone")))?;
            next_in(&parsed, &after.with_timezone(&tz))
        }
    };
    next_ms.map_err(|e| invalid(format!("it never fires ({e})")))
}

fn next_in<Tz: TimeZone>(cron: &Cron, after: &DateTime<Tz>) -> Result<Timestamp, croner::errors::CronError> {
    let next = cron.find_next_occurrence(after, false)?;
    // A time found after `after` is after the epoch, so it is not negative.
    Ok(Timestamp::from_millis(u64::try_from(next.timestamp_millis()).unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MONDAY_2026_11_30_UTC_MS: u64 = 1_795_996_800_000;

    fn at(expr: &str, zone: Option<&str>, after: u64) -> u64 {
        let record = CronRecord { expr: expr.into(), time_zone: zone.map(Into::into) };
        next_after(&record, Timestamp::from_millis(after)).expect("fires").as_millis()
    }

    #[test]
    fn weekdays_at_nine_skip_the_weekend() {
        let hour = 3_600_000;
        let day = 24 * hour;
        let monday = MONDAY_2026_11_30_UTC_MS;
        assert_eq!(at("0 9 * * MON-FRI", None, monday), monday + 9 * hour);
        // Friday after nine: the next is Monday.
        assert_eq!(at("0 9 * * MON-FRI", None, monday + 4 * day + 10 * hour), monday + 7 * day + 9 * hour);
        // Strictly after: at nine exactly, the next is tomorrow's.
        assert_eq!(at("0 9 * * MON-FRI", None, monday + 9 * hour), monday + day + 9 * hour);
    }

    #[test]
    fn a_time_zone_keeps_local_time() {
        let hour = 3_600_000;
        // Berlin is UTC+1 in winter: nine o'clock there is eight UTC.
        assert_eq!(
            at("0 9 * * *", Some("Europe/Berlin"), MONDAY_2026_11_30_UTC_MS),
            MONDAY_2026_11_30_UTC_MS + 8 * hour
        );
    }

    #[test]
    fn bad_expressions_and_zones_are_refused() {
        assert!(CronSchedule::parse("not cron").is_err());
        assert!(CronSchedule::parse("0 9 31 2 *").is_err(), "February 31st never comes");
        assert!(CronSchedule::parse("0 9 * * *").and_then(|c| c.in_time_zone("Mars/Olympus")).is_err());
        assert!(CronSchedule::parse("*/5 * * * * *").is_ok(), "seconds first");
    }
}
