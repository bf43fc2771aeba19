//! The score: every promise checked against the upstream, which counts objects itself.

use std::collections::{BTreeMap, BTreeSet};

use durafiber_demo::agents::{ORDER_ALARMS, ORDER_RECEIPT, ORDER_STREAM};
use durafiber_runtime::payload_hash;
use serde_json::{Value, json};

use super::{harness::Harness, report::TortureReport};

/// What the last server showed of every run.
pub(super) struct Finished {
    pub(super) runs: BTreeMap<String, Value>,
    /// Each run's storage, by key.
    pub(super) storage: BTreeMap<String, BTreeMap<String, Value>>,
    /// Each run's output stream, as `GET /runs/{id}/stream` lists it.
    pub(super) streams: BTreeMap<String, Vec<Value>>,
}

pub(super) fn is_terminal(run: &Value) -> bool {
    let status = &run["run"]["status"];
    ["completed", "failed", "cancelled", "escalated"].iter().any(|s| status.get(*s).is_some())
}

pub(super) fn hash_of(value: &Value) -> String {
    payload_hash(value).unwrap_or_default()
}

/// Fills in every count of the report from what the harness and the upstream saw.
pub(super) fn score(h: &Harness, finished: &Finished, report: &mut TortureReport) {
    report.runs = finished.runs.len().max(h.ids.values().flatten().count());
    report.ids_per_key_max = h.ids.values().map(BTreeSet::len).max().unwrap_or(0);
    let upstream = |collection: &str| h.upstream.objects(collection);
    let (charges, emails, alarms) = (upstream("charges"), upstream("emails"), upstream(ORDER_ALARMS));
    let (receipts, labels) = (upstream("receipts"), upstream("labels"));
    count_states(finished, report);
    report.stuck += h.ids.values().flatten().filter(|id| !finished.runs.contains_key(*id)).count();
    count_effects(finished, [&charges, &emails, &receipts, &labels], report);
    for run in finished.runs.values() {
        for entry in run["ledger"].as_array().cloned().unwrap_or_default() {
            if entry["committed"].is_null() {
                continue;
            }
            let collection = match entry["effect_id"].as_str() {
                Some("charge") => &charges,
                Some("receipt") => &receipts,
                _ => &emails,
            };
            let object = collection.iter().find(|o| o["idempotency_key"] == entry["idempotency_key"]);
            let matches = object
                .is_some_and(|o| entry["committed"]["receipt_hash"] == receipt_hash(&entry, o).as_str());
            if !matches {
                report.ledger_mismatches += 1;
            }
        }
        if run["run"]["status"].get("completed").is_none() {
            continue;
        }
        let run_id = run["run"]["run_id"].as_str().unwrap_or_default();
        let input = run["run"]["input"].clone();
        if !storage_as_told(run, &input, finished.storage.get(run_id), &charges) {
            report.storage_mismatches += 1;
        }
        if !label_as_told(run, &input, &labels) {
            report.children_wrong += 1;
        }
        if !stream_as_told(finished.streams.get(run_id)) {
            report.streams_wrong += 1;
        }
        if run["stash_version"] == 2 && run["stash"]["stash"]["phase"] == 3 {
            report.stash_v2 += 1;
        }
        let expected = input["alarm_delays_ms"].as_array().map(Vec::len).unwrap_or(0);
        for i in 0..expected {
            let key = format!("{run_id}:alarm:{i}");
            if !alarms.iter().any(|o| o["idempotency_key"] == key.as_str()) {
                report.alarms_lost += 1;
            }
        }
    }
}

/// Each run's end: completed, escalated, or stuck; the poison runs apart.
fn count_states(finished: &Finished, report: &mut TortureReport) {
    for run in finished.runs.values() {
        let status = &run["run"]["status"];
        if run["run"]["kind"] == "poison" {
            report.poison_runs += 1;
            let reason = status["escalated"]["reason"].as_str().unwrap_or_default();
            if reason.contains("ended the process") {
                report.poison_escalated += 1;
            } else {
                report.stuck += 1;
            }
            continue;
        }
        if status.get("completed").is_some() {
            report.completed += 1;
        } else if status.get("escalated").is_some() {
            report.escalated += 1;
        } else {
            report.stuck += 1;
        }
    }
}

/// Effects made more than once for an order, or never for a completed one.
fn count_effects(finished: &Finished, collections: [&Vec<Value>; 4], report: &mut TortureReport) {
    for objects in collections {
        let mut per_order: BTreeMap<String, usize> = BTreeMap::new();
        for o in objects.iter() {
            let order = o["request"]["order_id"].as_str().unwrap_or("?").to_string();
            *per_order.entry(order).or_default() += 1;
        }
        report.duplicate_effects += per_order.values().map(|n| n.saturating_sub(1)).sum::<usize>();
        for run in finished.runs.values() {
            let order = run["run"]["input"]["order_id"].as_str().map(str::to_string).unwrap_or_default();
            if run["run"]["status"].get("completed").is_some() && !per_order.contains_key(&order) {
                report.missing_effects += 1;
            }
        }
    }
}

/// The hash a ledger entry's receipt has when it is upstream object `o`: a streaming
/// effect's receipt keeps its chunks beside the answer, and where the stream holds them.
fn receipt_hash(entry: &Value, o: &Value) -> String {
    if entry["effect_id"] != "receipt" {
        return hash_of(o);
    }
    let chunks: Vec<String> = ORDER_RECEIPT.iter().filter_map(|c| serde_json::to_string(c).ok()).collect();
    let first_seq = ORDER_STREAM.iter().position(|c| *c == ORDER_RECEIPT[0]).unwrap_or(0);
    hash_of(&json!({"result": o, "chunks": chunks, "first_seq": first_seq}))
}

/// Whether a completed order's output stream is its phases and its streamed receipt,
/// numbered 0, 1, 2, … in order: one copy of the receipt, of the call that committed.
fn stream_as_told(chunks: Option<&Vec<Value>>) -> bool {
    let Some(chunks) = chunks else { return false };
    let told: Vec<(u64, String)> = chunks
        .iter()
        .filter_map(|c| Some((c["seq"].as_u64()?, serde_json::from_str(c["data_json"].as_str()?).ok()?)))
        .collect();
    let expected: Vec<(u64, String)> =
        ORDER_STREAM.iter().enumerate().map(|(n, p)| (n as u64, p.to_string())).collect();
    told == expected
}

/// Whether a completed order's output names the label its child run made upstream, for
/// this order.
fn label_as_told(run: &Value, input: &Value, labels: &[Value]) -> bool {
    let Some(output) = run["run"]["status"]["completed"]["output"].as_object() else { return false };
    let label = labels.iter().find(|o| o["request"]["order_id"] == input["order_id"]);
    label.is_some_and(|l| output.get("label_id") == Some(&l["id"]))
}

/// Whether a completed order's storage tells its story: the id of the upstream charge its
/// ledger committed, a sleep that lasted at least its duration, the payload of its event.
pub(super) fn storage_as_told(
    run: &Value,
    input: &Value,
    stored: Option<&BTreeMap<String, Value>>,
    charges: &[Value],
) -> bool {
    let Some(stored) = stored else { return false };
    let charge_key = run["ledger"]
        .as_array()
        .and_then(|l| l.iter().find(|e| e["effect_id"] == "charge"))
        .map(|e| e["idempotency_key"].clone());
    let charge = charges.iter().find(|o| Some(&o["idempotency_key"]) == charge_key.as_ref());
    let charge_ok = charge.is_some_and(|c| stored.get("charge_id") == Some(&c["id"]));
    let cool_off = input["cool_off_ms"].as_u64().unwrap_or(0);
    let slept = stored.get("cool_off").and_then(|c| Some((c[0].as_u64()?, c[1].as_u64()?)));
    let sleep_ok = slept.is_some_and(|(at, woke)| woke >= at.saturating_add(cool_off));
    let order = input["order_id"].as_str().unwrap_or_default().trim_start_matches("ord_");
    let packed_ok = stored.get("packed") == Some(&json!({"box": format!("box-order-{order}")}));
    charge_ok && sleep_ok && packed_ok
}
