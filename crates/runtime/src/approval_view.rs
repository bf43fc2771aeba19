//! How an agent would like a reviewer to see an approval's payload: a title, a one-line
//! summary, and labelled fields with formats (an amount with its currency, a time, a link).
//! The console shows it on the inbox and the decision page; the decision still quotes the
//! hash of the exact payload, which the page shows beside it.

use durafiber_api::Timestamp;
use serde::{Deserialize, Serialize};

/// An approval as a reviewer reads it. Build it in [`crate::Agent::approval_view`].
///
/// ```
/// use durafiber_runtime::{ApprovalView, FieldValue};
/// let view = ApprovalView::new("Refund order 1042")
///     .summary("Refund €120.00 to ada@example.com")
///     .field("Amount", FieldValue::Money { minor_units: 12_000, currency: "EUR".into() })
///     .field("Customer", FieldValue::Text("ada@example.com".into()))
///     .field("Order", FieldValue::Link { text: "#1042".into(), url: "https://shop.example/orders/1042".into() });
/// assert_eq!(view.fields.len(), 3);
/// ```
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalView {
    /// What the reviewer is asked, in a few words ("Refund order 1042").
    pub title: String,
    /// One line the inbox shows beside the title.
    pub summary: Option<String>,
    /// The payload's fields, in the order to show them.
    pub fields: Vec<ViewField>,
}

impl ApprovalView {
    /// A view with a title and nothing else yet.
    pub fn new(title: impl Into<String>) -> Self {
        ApprovalView { title: title.into(), summary: None, fields: Vec::new() }
    }

    /// The same view with a one-line summary.
    pub fn summary(mut self, summary: impl Into<String>) -> Self {
        self.summary = Some(summary.into());
        self
    }

    /// The same view with one more labelled field.
    pub fn field(mut self, label: impl Into<String>, value: FieldValue) -> Self {
        self.fields.push(ViewField { label: label.into(), value });
        self
    }
}

/// One labelled field of an [`ApprovalView`].
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ViewField {
    /// The label ("Amount").
    pub label: String,
    /// The value, with its format.
    pub value: FieldValue,
}

/// A field's value and how to show it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "format")]
pub enum FieldValue {
    /// Plain text.
    Text(String),
    /// An amount of money in minor units (cents) and an ISO 4217 code: shown `120.00 EUR`.
    Money {
        /// The amount in minor units.
        minor_units: i64,
        /// The currency's code.
        currency: String,
    },
    /// A moment, ms since the Unix epoch: shown in UTC.
    Time {
        /// The moment.
        at_ms: Timestamp,
    },
    /// A link the reviewer may follow (http or https only; anything else is shown as text).
    Link {
        /// What to show.
        text: String,
        /// Where it goes.
        url: String,
    },
    /// Any JSON value, shown as labelled fields.
    Json(serde_json::Value),
}

impl FieldValue {
    /// The value as one line of text (what the console shows, links aside).
    pub fn display(&self) -> String {
        match self {
            FieldValue::Text(text) => text.clone(),
            FieldValue::Money { minor_units, currency } => {
                let sign = if *minor_units < 0 { "-" } else { "" };
                let units = minor_units.unsigned_abs();
                format!("{sign}{}.{:02} {currency}", units / 100, units % 100)
            }
            FieldValue::Time { at_ms } => {
                let at =
                    std::time::UNIX_EPOCH.checked_add(std::time::Duration::from_millis(at_ms.as_millis()));
                match at {
                    Some(at) => humantime::format_rfc3339_seconds(at).to_string(),
                    None => format!("{at_ms} ms"),
                }
            }
            FieldValue::Link { text, url } => format!("{text} <{url}>"),
            FieldValue::Json(value) => value.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn money_and_times_read_as_people_write_them() {
        let euros = FieldValue::Money { minor_units: 12_005, currency: "EUR".into() };
        assert_eq!(euros.display(), "120.05 EUR");
        let owed = FieldValue::Money { minor_units: -7, currency: "USD".into() };
        assert_eq!(owed.display(), "-0.07 USD");
        let at = FieldValue::Time { at_ms: Timestamp::from_millis(1_767_225_600_000) };
        assert_eq!(at.display(), "2026-01-01T00:00:00Z");
    }
}
