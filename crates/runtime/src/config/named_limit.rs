//! Named limits on effects' calls, as the config writes them: `{"concurrency": 8, "rate": "600/min"}`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::RuntimeError;

/// A named limit on effects' calls (`limits` in the config, `EffectOptions::limit`): at most
/// `concurrency` calls at once and `rate` calls per period, for the whole runtime — for every
/// node, when several share a PostgreSQL store. An effect waits its turn before each call, in
/// the order the calls came (on each node; nodes take free slots as they come).
///
/// ```
/// use durafiber_runtime::RuntimeConfig;
///
/// let config = RuntimeConfig::from_json(r#"{"limits": {"openai": {"concurrency": 8, "rate": "600/min"}}}"#)?;
/// let openai = &config.limits["openai"];
/// assert_eq!(openai.concurrency, Some(8));
/// assert_eq!(openai.rate.map(|r| r.per_sec()), Some(10.0));
/// # Ok::<(), durafiber_runtime::RuntimeError>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NamedLimit {
    /// Calls at once, at most.
    pub concurrency: Option<u32>,
    /// Calls per period, at most: "600/min", "10/s", "5000/h", "20/10s".
    pub rate: Option<Rate>,
}

/// A rate of calls, written "N/period": the period `s`, `min`, `h`, `d` or any duration
/// ("10s"). Calls may come in bursts of one second's share (at least one), then at the rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Calls per `per`.
    pub calls: u32,
    /// The period.
    pub per: Duration,
}

impl Rate {
    /// Calls per second.
    pub fn per_sec(&self) -> f64 {
        f64::from(self.calls) / self.per.as_secs_f64()
    }

    /// The most calls that may come at once: one second's share, at least one.
    pub fn burst(&self) -> f64 {
        self.per_sec().max(1.0).min(f64::from(self.calls))
    }
}

impl std::str::FromStr for Rate {
    type Err = RuntimeError;

    fn from_str(text: &str) -> Result<Rate, RuntimeError> {
        let bad = |why: &str| RuntimeError::Config(format!("rate {text:?}: {why} (write it as \"600/min\")"));
        let (calls, per) = text.split_once('/').ok_or_else(|| bad("no '/'"))?;
        let calls: u32 = calls.trim().parse().map_err(|_| bad("no number of calls"))?;
        let per = match per.trim() {
            "s" | "sec" | "second" => Duration::from_secs(1),
            "min" | "minute" => Duration::from_secs(60),
            "h" | "hour" => Duration::from_secs(3_600),
            "d" | "day" => Duration::from_secs(86_400),
            other => humantime::parse_duration(other).map_err(|_| bad("an unknown period"))?,
        };
        if calls == 0 || per.is_zero() {
            return Err(bad("the calls and the period must be above zero"));
        }
        Ok(Rate { calls, per })
    }
}

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.calls, humantime::format_duration(self.per))
    }
}

impl Serialize for Rate {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Rate {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Rate, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}
