//! The approvals inbox and the decision page.

use durafiber_runtime::RunId;
use maud::{Markup, html};
use serde_json::Value;

use super::*;

/// One pending approval in the inbox.
pub struct InboxRow {
    /// The run.
    pub run_id: RunId,
    /// The pause.
    pub approval_id: String,
    /// The run's agent kind.
    pub kind: String,
    /// The run's idempotency key.
    pub key: String,
    /// How the agent would like it shown, if it says.
    pub view: Option<durafiber_runtime::ApprovalView>,
    /// How long it has waited.
    pub age: std::time::Duration,
    /// When silence escalates it.
    pub escalate_at: durafiber_api::Timestamp,
}

/// The inbox: one page of approvals waiting, and a link to the next page when there is one.
pub fn inbox(frame: &Frame, rows: &[InboxRow], next: Option<&str>) -> Markup {
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
                                td { (age(row.age)) }
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
                                td { (age(row.escalate_at.saturating_since(frame.now))) }
                                td { a.review href=(decision_url(&row.run_id, &row.approval_id)) { "Review" } }
                            }
                        }
                    }
                }
                @if let Some(next) = next { p { a #inbox-next href=(next) { "Next page" } } }
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
                " · asked " (age(frame.now.saturating_since(json_at(&approval["requested_at_ms"])))) " ago"
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
            @if let Some(tally) = quorum_line(approval) { p.notice #quorum { (tally) } }
            @if decided {
                (decided_box(approval))
            } @else if approval["escalated"].as_bool() == Some(true) {
                p.notice.bad { "Nobody answered in time: this approval was escalated, and can no longer be decided here." }
            } @else if let Some(mine) = own_vote(frame, approval) {
                p.notice #voted { "You have " (mine) " this; it waits for the others. One person counts once." }
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

/// "1 of 2 — approved by alice", for an approval that takes more than one person.
fn quorum_line(approval: &Value) -> Option<String> {
    let required = approval["rule"]["required"].as_u64()?;
    let votes = approval["votes"].as_array().map(Vec::as_slice).unwrap_or_default();
    let who = |approved: bool| -> Vec<&str> {
        votes
            .iter()
            .filter(|v| v["approved"].as_bool() == Some(approved))
            .filter_map(|v| v["by"].as_str())
            .collect()
    };
    let (yes, no) = (who(true), who(false));
    let mut line = format!("{} of {required}", yes.len());
    if !yes.is_empty() {
        line.push_str(&format!(" — approved by {}", yes.join(", ")));
    }
    if !no.is_empty() {
        line.push_str(&format!(" — declined by {}", no.join(", ")));
    }
    let reviewers: Vec<&str> =
        approval["rule"]["reviewers"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    if !reviewers.is_empty() {
        line.push_str(&format!(" (reviewers: {})", reviewers.join(", ")));
    }
    Some(line)
}

/// "approved" or "declined", when the signed-in person has decided this approval already.
fn own_vote(frame: &Frame, approval: &Value) -> Option<&'static str> {
    let name = &frame.session?.caller.name;
    let vote = approval["votes"].as_array()?.iter().find(|v| v["by"].as_str() == Some(name.as_str()))?;
    Some(if vote["approved"].as_bool() == Some(true) { "approved" } else { "declined" })
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
