//! The console's pages as HTML, from what the handlers read. Every value is escaped by the
//! template; nothing here reads the store or decides anything.

use std::time::Duration;

use durafiber_api::Timestamp;
use maud::{DOCTYPE, Markup, html};
use serde_json::Value;

use crate::{auth::Role, session::Session};

mod approvals;
mod runs;

pub use approvals::{DecisionView, InboxRow, decision, inbox};
pub use runs::{RunRow, RunView, StoreLine, TimelineEntry, attention, run, runs};

/// What every page's frame needs: who is signed in (none on the sign-in page) and the
/// CSRF token of its forms.
pub struct Frame<'a> {
    /// The signed-in session, if any.
    pub session: Option<&'a Session>,
    /// Clock time now, ms (ages are shown against it).
    pub now: Timestamp,
    /// Which part of the navigation the page belongs to.
    pub section: Section,
    /// Approvals waiting for a decision, when they could be counted (up to one past
    /// [`COUNT_SHOWN_MAX`]).
    pub waiting: Option<usize>,
    /// Escalated runs and dead letters, when they could be counted.
    pub attention: Option<usize>,
}

/// The parts of the console the navigation names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    /// The inbox and the decision pages.
    Approvals,
    /// The runs and a run's page.
    Runs,
    /// Escalated runs and dead letters.
    Attention,
    /// Sign-in and messages.
    Other,
}

impl Frame<'_> {
    fn csrf(&self) -> &str {
        self.session.map_or("", |s| s.csrf.as_str())
    }

    fn may(&self, role: Role) -> bool {
        self.session.is_some_and(|s| s.caller.role >= role)
    }
}

/// The page around `body`: head, navigation, who is signed in, and sign-out.
pub fn layout(frame: &Frame, title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · durafiber" }
                link rel="stylesheet" href="/ui/static/console.css";
            }
            body {
                header {
                    a.brand href="/ui/approvals" { "durafiber" }
                    @if let Some(session) = frame.session {
                        nav {
                            (nav_link(frame, Section::Approvals, "/ui/approvals", "Approvals", frame.waiting, "nav-approvals"))
                            (nav_link(frame, Section::Runs, "/ui/runs", "Runs", None, "nav-runs"))
                            (nav_link(frame, Section::Attention, "/ui/attention", "Needs attention", frame.attention, "nav-attention"))
                        }
                        form.who method="post" action="/ui/sign-out" {
                            span #signed-in-as { (session.caller.name) " (" (session.caller.role) ")" }
                            input type="hidden" name="csrf" value=(frame.csrf());
                            button #sign-out type="submit" { "Sign out" }
                        }
                    }
                }
                main { h1 { (title) } (body) }
            }
        }
    }
}

/// One link of the navigation: marked when the page is in its section, with a count of
/// what waits there when there is any.
/// The most a navigation count shows; past it, "200+": counting every one would read them all.
pub const COUNT_SHOWN_MAX: usize = 200;

fn nav_link(
    frame: &Frame,
    section: Section,
    href: &str,
    name: &str,
    count: Option<usize>,
    id: &str,
) -> Markup {
    let current = frame.section == section;
    html! {
        a #(id) href=(href) class=[current.then_some("current")] aria-current=[current.then_some("page")] {
            (name)
            @if let Some(n) = count.filter(|n| *n > 0) {
                " " span.count { @if n > COUNT_SHOWN_MAX { (COUNT_SHOWN_MAX) "+" } @else { (n) } }
            }
        }
    }
}

/// The sign-in form.
pub fn sign_in(frame: &Frame, csrf: &str, next: &str, refused: Option<&str>) -> Markup {
    layout(
        frame,
        "Sign in",
        html! {
            @if let Some(why) = refused { p.notice.bad #refused { (why) } }
            form.card method="post" action="/ui/sign-in" {
                label for="token" { "API token" }
                input #token type="password" name="token" autocomplete="off" required;
                input type="hidden" name="csrf" value=(csrf);
                input type="hidden" name="next" value=(next);
                button #sign-in type="submit" { "Sign in" }
            }
            p.hint { "Tokens come from " code { "durafiber tokens create NAME --role reviewer" } "." }
        },
    )
}

/// A message at the top of a page.
pub struct Notice {
    /// Good news or bad.
    pub good: bool,
    /// What to say.
    pub text: String,
}

fn stash(stash: &Value) -> Markup {
    html! {
        @if stash.is_null() {
            p.empty #stash { "Nothing stashed yet." }
        } @else {
            div #stash {
                p.meta { "Step " b { (text(&stash["step"])) } " · seq " (text(&stash["seq"])) " · attempt " (text(&stash["attempt"])) }
                (readable(&stash["stash"]))
            }
        }
    }
}

fn ledger(ledger: &Value) -> Markup {
    let entries = ledger.as_array().cloned().unwrap_or_default();
    html! {
        @if entries.is_empty() {
            p.empty #ledger { "No effect yet." }
        } @else {
            table #ledger {
                thead { tr { th { "Effect" } th { "Idempotency key" } th { "State" } th { "Receipt" } } }
                tbody {
                    @for e in &entries {
                        tr {
                            td { (text(&e["effect_id"])) }
                            td { code { (text(&e["idempotency_key"])) } }
                            @if e["committed"].is_null() {
                                td { "prepared, not committed" } td {}
                            } @else {
                                td { "committed" }
                                td { details { summary { "receipt" } pre { (pretty(&e["committed"]["receipt"])) } } }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn event_table(events: &[durafiber_runtime::Event], id: &str) -> Markup {
    html! {
        table.events id=(id) {
            thead { tr { th { "When" } th { "What" } th { "Detail" } } }
            tbody {
                @for e in events { tr { td { (clock(e.at_ms)) } td { (e.kind) } td { (e.detail) } } }
            }
        }
    }
}

/// A page that only says something (an error, a refusal), with a way back.
pub fn message(frame: &Frame, title: &str, notice_text: &str, back: &str) -> Markup {
    layout(
        frame,
        title,
        html! {
            p.notice.bad #message { (notice_text) }
            p { a #back href=(back) { "Back" } }
        },
    )
}

fn notice(notice: &Option<Notice>) -> Markup {
    html! {
        @if let Some(n) = notice { p.notice.(if n.good { "good" } else { "bad" }) #notice { (n.text) } }
    }
}

/// JSON shown for reading: objects as labelled fields, lists as lists, text as text.
pub fn readable(value: &Value) -> Markup {
    match value {
        Value::Object(map) if !map.is_empty() => html! {
            dl.readable {
                @for (key, field) in map { dt { (label(key)) } dd { (readable(field)) } }
            }
        },
        Value::Array(items) if !items.is_empty() => html! {
            ol.readable { @for item in items { li { (readable(item)) } } }
        },
        Value::Null => html! { span.empty { "—" } },
        Value::String(s) => html! { (s) },
        other => html! { (other.to_string()) },
    }
}

/// `amount_cents` → `Amount cents`.
fn label(key: &str) -> String {
    let words = key.replace(['_', '-'], " ");
    let mut chars = words.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
}

fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// The state's name from a serialized `RunStatus` (`"running"` or `{"completed": {...}}`).
fn state_name(status: &Value) -> String {
    match status {
        Value::String(s) => s.clone(),
        Value::Object(map) => map.keys().next().cloned().unwrap_or_default(),
        _ => String::new(),
    }
}

fn is_terminal(state: &str) -> bool {
    matches!(state, "completed" | "failed" | "cancelled" | "escalated")
}

/// The reason, error or wait of a serialized status.
fn status_detail(status: &Value) -> Option<String> {
    let inner = status.as_object()?.values().next()?;
    ["reason", "error", "approval_id", "name"].iter().find_map(|k| inner[*k].as_str().map(str::to_string))
}

fn status_text(status: &durafiber_store::tables::RunStatus) -> String {
    use durafiber_store::tables::RunStatus::*;
    match status {
        Escalated { reason } | Cancelled { reason } | Paused { reason } => reason.clone(),
        Failed { error } => error.clone(),
        other => other.name().to_string(),
    }
}

/// Where a run's page is, for the run id a page shows (as its JSON view holds it).
pub fn run_url(id: &str) -> String {
    format!("/ui/runs/{}", enc(id))
}

/// Where an approval's decision page is.
pub fn decision_url(id: &str, approval_id: &str) -> String {
    format!("/ui/runs/{}/approvals/{}", enc(id), enc(approval_id))
}

fn enc(part: &str) -> String {
    url::form_urlencoded::byte_serialize(part.as_bytes()).collect()
}

/// A duration in ms, to the second: `3m 20s`.
pub fn age(d: Duration) -> String {
    let secs = Duration::from_secs(d.as_secs());
    if secs.is_zero() { "under a second".into() } else { humantime::format_duration(secs).to_string() }
}

/// A clock time as UTC, to the second.
fn clock(at: Timestamp) -> String {
    let shown = std::time::UNIX_EPOCH.checked_add(Duration::from_millis(at.as_millis()));
    shown.map(|t| humantime::format_rfc3339_seconds(t).to_string()).unwrap_or_else(|| at.to_string())
}

/// A time the API's JSON carries as ms (`..._ms`); the epoch when it is missing.
pub fn json_at(v: &serde_json::Value) -> Timestamp {
    Timestamp::from_millis(v.as_u64().unwrap_or(0))
}
