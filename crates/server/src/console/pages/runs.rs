//! The runs list, a run's page, and what needs attention.

use maud::{Markup, html};
use serde_json::Value;

use super::*;

/// One row of the runs list.
pub struct RunRow<'a> {
    /// The run record.
    pub run: &'a durafiber_store::tables::RunRecord,
}

/// How the store stands, under the runs list: what an operator watches over months.
pub struct StoreLine {
    /// Bytes of the store's files on disk; 0 on PostgreSQL.
    pub store_bytes: u64,
    /// How long acknowledged writes have waited for their checkpoint; `None` on PostgreSQL.
    pub checkpoint_lag: Option<std::time::Duration>,
    /// Settled runs this process deleted by retention since it started.
    pub deleted_by_retention: u64,
}

/// The runs list with its filters (a state, one of the kinds the server hosts), the link
/// to the next page, and how the store stands.
pub fn runs(
    frame: &Frame,
    rows: &[RunRow],
    state: &str,
    (kind, kinds): (&str, &[String]),
    next: Option<&str>,
    store: &StoreLine,
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
                            td { (age(frame.now.saturating_since(row.run.updated_at_ms))) " ago" }
                        }
                    }
                }
            }
            @if rows.is_empty() { p.empty { "No run matches." } }
            @if let Some(after) = next {
                a #next-page href=(format!("/ui/runs?state={}&kind={}&after={}", enc(state), enc(kind), enc(after))) { "Next page →" }
            }
            p.hint #store {
                @if store.store_bytes > 0 { "Store: " (format!("{:.1}", store.store_bytes as f64 / 1_048_576.0)) " MiB on disk · " }
                @if let Some(lag) = store.checkpoint_lag { "checkpoint " (age(lag)) " behind · " }
                (store.deleted_by_retention) " runs deleted by retention since the server started"
            }
        },
    )
}

/// One entry of a run's timeline.
pub struct TimelineEntry {
    /// When.
    pub at: durafiber_api::Timestamp,
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
            (summary(run, &state))
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
                        @for e in view.timeline { tr { td { (clock(e.at)) } td { (e.what) } td { (e.detail) } } }
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

/// What the run is: its state, kind, key, attempt, age, family, limit and trace.
fn summary(run: &Value, state: &str) -> Markup {
    let record = &run["run"];
    let status = &record["status"];
    html! {
        dl.summary {
            dt { "State" } dd { b #state { (state) } }
            dt { "Kind" } dd { (text(&record["kind"])) }
            dt { "Key" } dd { code { (text(&record["key"])) } }
            dt { "Attempt" } dd { (text(&record["attempt"])) }
            dt { "Created" } dd { (clock(json_at(&record["created_at_ms"]))) }
            @if let Some(detail) = status_detail(status) { dt { "Why" } dd #why { (detail) } }
            @if let Some(parent) = run["parent"]["parent_run_id"].as_str() {
                dt { "Parent" } dd #parent { a href=(run_url(parent)) { code { (parent) } } " (as " (text(&run["parent"]["name"])) ")" }
            }
            @if let Some(children) = run["children"].as_array().filter(|c| !c.is_empty()) {
                dt { "Children" } dd #children {
                    @for c in children {
                        a href=(run_url(&text(&c["run_id"]))) { (text(&c["name"])) } " " (text(&c["state"])) " "
                    }
                }
            }
            @if let Some(limit) = run["waiting_on_limit"].as_str() { dt { "Waiting" } dd #limit { "its turn in limit " code { (limit) } } }
            dt { "Trace" } dd {
                @match run["trace_url"].as_str().filter(|u| u.starts_with("http://") || u.starts_with("https://")) {
                    Some(url) => a #trace href=(url) rel="noopener" { code { (text(&run["trace_id"])) } },
                    None => code #trace { (text(&run["trace_id"])) },
                }
            }
        }
    }
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
                            td { (clock(json_at(&a["due_at_ms"]))) }
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
    alarm["every_ms"].as_u64().map(|ms| age(std::time::Duration::from_millis(ms))).unwrap_or_default()
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
                        tr { td { (text(&d["alarm"]["name"])) } td { (clock(json_at(&d["dead_at_ms"]))) } td { (text(&d["last_error"])) } }
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
                                td { (age(frame.now.saturating_since(r.updated_at_ms))) " ago" }
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
                                td { (age(frame.now.saturating_since(d.dead_at_ms))) " ago" }
                            }
                        }
                    }
                }
            }
        },
    )
}
