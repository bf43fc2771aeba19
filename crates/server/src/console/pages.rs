//! The console's pages as HTML, from what the handlers read. Every value is escaped by the
//! template; nothing here reads the store or decides anything.

use maud::{DOCTYPE, Markup, html};
use serde_json::Value;

use crate::{auth::Role, session::Session};

/// What every page's frame needs: who is signed in (none on the sign-in page) and the
/// CSRF token of its forms.
pub struct Frame<'a> {
    /// The signed-in session, if any.
    pub session: Option<&'a Session>,
    /// Clock time now, ms (ages are shown against it).
    pub now_ms: u64,
    /// Which part of the navigation the page belongs to.
    pub section: Section,
    /// Approvals waiting for a decision, when they could be counted.
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
            @if let Some(n) = count.filter(|n| *n > 0) { " " span.count { (n) } }
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

/// One pending approval in the inbox.
pub struct InboxRow {
    /// The run.
    pub run_id: String,
    /// The pause.
    pub approval_id: String,
    /// The run's agent kind.
    pub kind: String,
    /// The run's idempotency key.
    pub key: String,
    /// How the agent would like it shown, if it says.
    pub view: Option<durafiber_runtime::ApprovalView>,
    /// How long it has waited, ms.
    pub age_ms: u64,
    /// When silence escalates it, ms.
    pub escalate_at_ms: u64,
}

/// Pending approvals, oldest first.
pub fn inbox(frame: &Frame, rows: &[InboxRow]) -> Markup {
    layout(
        frame,
        "Approvals waiting",
        html! {
            @if rows.is_empty() {
                p #inbox-empty { "Nothing waits for a decision." }
            } @else {
                table #inbox {
                    thead { tr { th { "Waiting" } th { "What" } th { "Kind" } th { "Run key" } th { "Escalates in" } th {} } }
                    tbody {
                        @for row in rows {
                            tr {
                                td { (age(row.age_ms)) }
                                td {
                                    @match &row.view {
                                        Some(view) => {
                                            b.title { (view.title) }
                                            @if let Some(summary) = &view.summary { br; span.summary { (summary) } }
                                        }
                                        None => { (row.approval_id) }
                                    }
                                }
                                td { (row.kind) }
                                td { code { (row.key) } }
                                td { (age(row.escalate_at_ms.saturating_sub(frame.now_ms))) }
                                td { a.review href=(decision_url(&row.run_id, &row.approval_id)) { "Review" } }
                            }
                        }
                    }
                }
            }
        },
    )
}

/// The decision page's content: the payload, its hash, the run's context, and the form.
pub struct DecisionView<'a> {
    /// The run view (`view::run`).
    pub run: &'a Value,
    /// The approval record in it.
    pub approval: &'a Value,
    /// How the agent would like the payload shown, if it says.
    pub shown: Option<&'a durafiber_runtime::ApprovalView>,
    /// The run's recent events, oldest first.
    pub events: &'a [durafiber_runtime::Event],
    /// What happened to an earlier attempt to decide, if anything.
    pub notice: Option<Notice>,
}

/// A message at the top of a page.
pub struct Notice {
    /// Good news or bad.
    pub good: bool,
    /// What to say.
    pub text: String,
}

/// An approval: what the human is asked to decide, with what the run knew.
pub fn decision(frame: &Frame, view: &DecisionView) -> Markup {
    let (run, approval) = (view.run, view.approval);
    let run_id = text(&run["run"]["run_id"]);
    let approval_id = text(&approval["approval_id"]);
    let decided = !approval["decision"].is_null();
    layout(
        frame,
        &format!("Approve {approval_id}?"),
        html! {
            (notice(&view.notice))
            p.meta {
                "Run " a href=(run_url(&run_id)) { code { (run_id) } }
                " · kind " b { (text(&run["run"]["kind"])) }
                " · key " code { (text(&run["run"]["key"])) }
                " · asked " (age(frame.now_ms.saturating_sub(approval["requested_at_ms"].as_u64().unwrap_or(0)))) " ago"
            }
            section.card #payload {
                h2 { "What the run asks" }
                @match view.shown {
                    Some(shown) => (approval_view(shown)),
                    None => (readable(&approval["payload"])),
                }
                details open[view.shown.is_none()] {
                    summary { "Exact JSON" }
                    pre #payload-json { (pretty(&approval["payload"])) }
                }
                p.hash { "Payload hash " code #payload-hash { (text(&approval["payload_hash"])) } }
            }
            (context(run, &approval_id, view.events))
            @if decided {
                (decided_box(approval))
            } @else if approval["escalated"].as_bool() == Some(true) {
                p.notice.bad { "Nobody answered in time: this approval was escalated, and can no longer be decided here." }
            } @else if frame.may(Role::Reviewer) {
                form.card #decide method="post" action=(decision_url(&run_id, &approval_id)) {
                    h2 { "Your decision" }
                    p.hint { "You decide on the payload above; its hash goes with your decision, so a payload changed since is refused." }
                    input type="hidden" name="csrf" value=(frame.csrf());
                    input type="hidden" name="payload_hash" value=(text(&approval["payload_hash"]));
                    label for="comment" { "Comment (kept with the decision)" }
                    textarea #comment name="comment" rows="3" {}
                    div.buttons {
                        button #approve type="submit" name="decision" value="approve" { "Approve" }
                        button #decline.secondary type="submit" name="decision" value="decline" { "Decline" }
                    }
                }
            } @else {
                p.notice #read-only { "Your token is a reader: you can see this approval but not decide it." }
            }
        },
    )
}

/// An approval as its agent would like it shown: the title, the summary, each field in its
/// format. A link is followed only when it is http or https.
fn approval_view(view: &durafiber_runtime::ApprovalView) -> Markup {
    use durafiber_runtime::FieldValue;
    html! {
        div #approval-view {
            p.title #approval-title { b { (view.title) } }
            @if let Some(summary) = &view.summary { p.summary #approval-summary { (summary) } }
            dl.readable {
                @for field in &view.fields {
                    dt { (field.label) }
                    dd {
                        @match &field.value {
                            FieldValue::Link { text, url } if url.starts_with("https://") || url.starts_with("http://") => {
                                a href=(url) rel="noopener noreferrer" { (text) }
                            }
                            FieldValue::Json(value) => (readable(value)),
                            other => (other.display()),
                        }
                    }
                }
            }
        }
    }
}

fn decided_box(approval: &Value) -> Markup {
    let approved = approval["decision"]["approved"].as_bool() == Some(true);
    html! {
        p.notice.(if approved { "good" } else { "bad" }) #decided {
            (if approved { "Approved" } else { "Declined" })
            @if let Some(name) = approval["decided_by"].as_str() { " by " b { (name) } }
            @let comment = text(&approval["decision"]["comment"]);
            @if !comment.is_empty() { ": “" (comment) "”" }
        }
    }
}

/// What the run knew when it asked: its stash, its effects and their receipts, earlier
/// decisions, and what happened lately.
fn context(run: &Value, approval_id: &str, events: &[durafiber_runtime::Event]) -> Markup {
    let earlier: Vec<&Value> = run["approvals"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| text(&a["approval_id"]) != approval_id && !a["decision"].is_null())
        .collect();
    html! {
        section.card #context {
            h2 { "What the run knew" }
            h3 { "Its stash" }
            (stash(&run["stash"]))
            h3 { "Its effects" }
            (ledger(&run["ledger"]))
            h3 { "Earlier decisions" }
            @if earlier.is_empty() {
                p.empty { "None." }
            } @else {
                ul #earlier { @for a in &earlier { li { b { (text(&a["approval_id"])) } ": " (decided_box(a)) } } }
            }
            h3 { "Recent events" }
            (event_table(events, "recent-events"))
        }
    }
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

/// One row of the runs list.
pub struct RunRow<'a> {
    /// The run record.
    pub run: &'a durafiber_store::tables::RunRecord,
}

/// The runs list with its filters (a state, one of the kinds the server hosts) and the link
/// to the next page.
pub fn runs(
    frame: &Frame,
    rows: &[RunRow],
    state: &str,
    (kind, kinds): (&str, &[String]),
    next: Option<&str>,
) -> Markup {
    let states = [
        "accepted",
        "running",
        "waiting_approval",
        "waiting_alarm",
        "waiting_event",
        "completed",
        "failed",
        "cancelled",
        "escalated",
        "paused",
    ];
    layout(
        frame,
        "Runs",
        html! {
            form.filters method="get" action="/ui/runs" {
                label for="state" { "State" }
                select #state name="state" {
                    option value="" { "any" }
                    @for s in states { option value=(s) selected[s == state] { (s) } }
                }
                label for="kind" { "Kind" }
                select #kind name="kind" {
                    option value="" { "any" }
                    @for k in kinds { option value=(k) selected[k == kind] { (k) } }
                }
                button type="submit" { "Filter" }
            }
            table #runs {
                thead { tr { th { "Run" } th { "Kind" } th { "Key" } th { "State" } th { "Updated" } } }
                tbody {
                    @for row in rows {
                        tr {
                            td { a href=(run_url(&row.run.run_id)) { code { (row.run.run_id) } } }
                            td { (row.run.kind) }
                            td { code { (row.run.key) } }
                            td.state { (row.run.status.name()) }
                            td { (age(frame.now_ms.saturating_sub(row.run.updated_at_ms))) " ago" }
                        }
                    }
                }
            }
            @if rows.is_empty() { p.empty { "No run matches." } }
            @if let Some(after) = next {
                a #next-page href=(format!("/ui/runs?state={}&kind={}&after={}", enc(state), enc(kind), enc(after))) { "Next page →" }
            }
        },
    )
}

/// One entry of a run's timeline.
pub struct TimelineEntry {
    /// When, ms.
    pub at_ms: u64,
    /// What.
    pub what: String,
    /// Details.
    pub detail: String,
}

/// A run: its state, its timeline, its records and, for operators, cancel.
pub struct RunView<'a> {
    /// The run view (`view::run`).
    pub run: &'a Value,
    /// Durable facts and this process's events, merged by time.
    pub timeline: &'a [TimelineEntry],
    /// The last event sequence number shown: the live view follows from there.
    pub last_seq: u64,
    /// What happened to an earlier action, if anything.
    pub notice: Option<Notice>,
}

/// The run page.
pub fn run(frame: &Frame, view: &RunView) -> Markup {
    let run = view.run;
    let record = &run["run"];
    let run_id = text(&record["run_id"]);
    let status = &record["status"];
    let state = state_name(status);
    layout(
        frame,
        &format!("Run {run_id}"),
        html! {
            (notice(&view.notice))
            dl.summary {
                dt { "State" } dd { b #state { (state) } }
                dt { "Kind" } dd { (text(&record["kind"])) }
                dt { "Key" } dd { code { (text(&record["key"])) } }
                dt { "Attempt" } dd { (text(&record["attempt"])) }
                dt { "Created" } dd { (clock(record["created_at_ms"].as_u64().unwrap_or(0))) }
                @if let Some(detail) = status_detail(status) { dt { "Why" } dd #why { (detail) } }
            }
            @for a in run["approvals"].as_array().into_iter().flatten().filter(|a| a["decision"].is_null() && a["escalated"].as_bool() != Some(true)) {
                p.notice { "Waiting for a decision: " a href=(decision_url(&run_id, &text(&a["approval_id"]))) { "review " (text(&a["approval_id"])) } }
            }
            @if let Some(output) = status.get("completed").map(|c| &c["output"]).filter(|o| !o.is_null()) {
                section.card { h2 { "Output" } (readable(output)) }
            }
            section.card {
                h2 { "Timeline" }
                p.hint #live-note { "Follows the run as it happens when JavaScript is on; otherwise " a href=(run_url(&run_id)) { "reload" } "." }
                table.events #timeline data-run=(run_id) data-after=(view.last_seq) {
                    thead { tr { th { "When" } th { "What" } th { "Detail" } } }
                    tbody {
                        @for e in view.timeline { tr { td { (clock(e.at_ms)) } td { (e.what) } td { (e.detail) } } }
                    }
                }
            }
            section.card { h2 { "Stash" } (stash(&run["stash"])) }
            section.card { h2 { "Effects" } (ledger(&run["ledger"])) }
            section.card { h2 { "Alarms" } (alarms(&run["alarms"])) }
            section.card { h2 { "Dead letters" } (dead_letters(&run["dead_letters"])) }
            @if frame.may(Role::Operator) && !is_terminal(&state) {
                form.card #cancel method="post" action=(format!("{}/cancel", run_url(&run_id))) {
                    h2 { "Cancel this run" }
                    input type="hidden" name="csrf" value=(frame.csrf());
                    label for="reason" { "Reason" }
                    input #reason name="reason" required;
                    button.danger type="submit" { "Cancel run" }
                }
            }
            script src="/ui/static/live.js" {}
        },
    )
}

fn alarms(alarms: &Value) -> Markup {
    let list = alarms.as_array().cloned().unwrap_or_default();
    html! {
        @if list.is_empty() {
            p.empty { "No alarm pending." }
        } @else {
            table {
                thead { tr { th { "Name" } th { "Next due" } th { "Repeats" } th { "Attempts" } th { "Retrying" } } }
                tbody {
                    @for a in &list {
                        tr {
                            td { (text(&a["name"])) @if !a["system"].is_null() { " " span.tag { "runtime" } } }
                            td { (clock(a["due_at_ms"].as_u64().unwrap_or(0))) }
                            td { (repeats(a)) }
                            td { (text(&a["attempts_started"])) }
                            td { (a["retrying"].as_array().map_or(0, Vec::len)) }
                        }
                    }
                }
            }
        }
    }
}

/// How an alarm repeats: its cron schedule and zone, its period, or nothing.
fn repeats(alarm: &Value) -> String {
    if let Some(expr) = alarm["cron"]["expr"].as_str() {
        let zone = alarm["cron"]["time_zone"].as_str().unwrap_or("UTC");
        return format!("cron {expr} ({zone})");
    }
    alarm["every_ms"].as_u64().map(age).unwrap_or_default()
}

fn dead_letters(letters: &Value) -> Markup {
    let list = letters.as_array().cloned().unwrap_or_default();
    html! {
        @if list.is_empty() {
            p.empty { "None." }
        } @else {
            table {
                thead { tr { th { "Alarm" } th { "Abandoned" } th { "Last error" } } }
                tbody {
                    @for d in &list {
                        tr { td { (text(&d["alarm"]["name"])) } td { (clock(d["dead_at_ms"].as_u64().unwrap_or(0))) } td { (text(&d["last_error"])) } }
                    }
                }
            }
        }
    }
}

/// Escalated runs and dead-lettered alarms: what a human must look at.
pub fn attention(
    frame: &Frame,
    escalated: &[durafiber_store::tables::RunRecord],
    letters: &[durafiber_store::tables::DeadLetter],
) -> Markup {
    layout(
        frame,
        "Needs attention",
        html! {
            h2 { "Escalated runs" }
            @if escalated.is_empty() { p.empty #no-escalated { "None." } } @else {
                table #escalated {
                    thead { tr { th { "Run" } th { "Kind" } th { "Key" } th { "Reason" } th { "Since" } } }
                    tbody {
                        @for r in escalated {
                            tr {
                                td { a href=(run_url(&r.run_id)) { code { (r.run_id) } } }
                                td { (r.kind) } td { code { (r.key) } }
                                td { (status_text(&r.status)) }
                                td { (age(frame.now_ms.saturating_sub(r.updated_at_ms))) " ago" }
                            }
                        }
                    }
                }
            }
            h2 { "Dead-lettered alarms" }
            @if letters.is_empty() { p.empty #no-dead-letters { "None." } } @else {
                table #dead-letters {
                    thead { tr { th { "Run" } th { "Alarm" } th { "Last error" } th { "Since" } } }
                    tbody {
                        @for d in letters {
                            tr {
                                td { a href=(run_url(&d.alarm.run_id)) { code { (d.alarm.run_id) } } }
                                td { (d.alarm.name) } td { (d.last_error) }
                                td { (age(frame.now_ms.saturating_sub(d.dead_at_ms))) " ago" }
                            }
                        }
                    }
                }
            }
        },
    )
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

/// Where a run's page is.
pub fn run_url(run_id: &str) -> String {
    format!("/ui/runs/{}", enc(run_id))
}

/// Where an approval's decision page is.
pub fn decision_url(run_id: &str, approval_id: &str) -> String {
    format!("/ui/runs/{}/approvals/{}", enc(run_id), enc(approval_id))
}

fn enc(part: &str) -> String {
    url::form_urlencoded::byte_serialize(part.as_bytes()).collect()
}

/// A duration in ms, to the second: `3m 20s`.
pub fn age(ms: u64) -> String {
    let secs = std::time::Duration::from_secs(ms / 1_000);
    if secs.is_zero() { "under a second".into() } else { humantime::format_duration(secs).to_string() }
}

/// A clock time in ms as UTC, to the second.
fn clock(ms: u64) -> String {
    let at = std::time::UNIX_EPOCH.checked_add(std::time::Duration::from_millis(ms));
    at.map(|t| humantime::format_rfc3339_seconds(t).to_string()).unwrap_or_else(|| ms.to_string())
}
