//! Fork cases (`AgentCheck::fork_at_every_boundary`): the run is played to its end, then
//! forked from each boundary of its history in turn and the fork played to its end. A fork
//! must end in the state the run did (its output may differ: what came after its point was
//! done anew), call the upstream with none of the keys it inherited, make new
//! objects only for what it did not inherit, and leave the run it came from unchanged.

use durafiber_runtime::StartRequest;
use durafiber_runtime::Timestamp;
use std::collections::BTreeSet;

use durafiber_runtime::{Agent, ForkOptions, RunId, Runtime};
use durafiber_store::SimBackend;
use serde_json::Value;

use super::{AgentCheck, CaseReport, Unplayable, play::record_end};
use crate::SIM_EPOCH_MS;

/// The source's idempotency key in every case, and the fork's.
const SOURCE_KEY: &str = "checked-run";
const FORK_KEY: &str = "checked-fork";

/// What a run's records say, to compare before and after a fork.
fn records_of(rt: &Runtime, run_id: &RunId) -> Result<Value, Unplayable> {
    let mut shown =
        serde_json::to_value(rt.inspect(run_id).map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    shown["history"] =
        serde_json::to_value(rt.history(run_id).map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    Ok(shown)
}

impl<A: Agent + Clone> AgentCheck<A> {
    /// The boundaries of the uninterrupted run's history, played once more to read them.
    pub(super) async fn history_seqs(&self) -> Result<Vec<u64>, Unplayable> {
        let (sim, rt, run_id) = self.played_source().await?;
        let seqs = rt.history(&run_id).map_err(|e| e.to_string())?.iter().map(|h| h.seq).collect();
        rt.shutdown().await;
        drop(sim);
        Ok(seqs)
    }

    /// The run played to its end on a fresh simulated disk.
    async fn played_source(&self) -> Result<(SimBackend, Runtime, RunId), Unplayable> {
        if let Some(upstream) = &self.upstream {
            upstream.reset().await;
        }
        let input = self.input.as_ref().ok_or("no input: call .input(&input)")?;
        let sim = SimBackend::new();
        let rt = self.open(&sim, Timestamp::from_millis(SIM_EPOCH_MS), self.config.clone(), None).await?;
        let started = rt
            .start_run(StartRequest::new(A::KIND, SOURCE_KEY, input.clone()).with_options(self.options))
            .await;
        let run_id = started.map_err(|e| format!("start: {e}"))?.run_id;
        let mut scratch = CaseReport::named("source", None);
        if self.drive(&rt, &sim, &run_id, &mut scratch).await.is_none() {
            return Err(format!("the run to fork did not finish: {:?}", scratch.problems).into());
        }
        Ok((sim, rt, run_id))
    }

    /// The run played to its end, then forked from boundary `at` and the fork played to its
    /// end.
    pub(super) async fn play_fork(&self, at: u64, baseline: &CaseReport) -> CaseReport {
        let mut report = CaseReport::named(&format!("forked at boundary {at}"), None);
        let (sim, rt, source) = match self.played_source().await {
            Ok(played) => played,
            Err(e) => {
                report.problems.push(e.into());
                return report;
            }
        };
        let before = records_of(&rt, &source);
        let (calls_before, objects_before) = match &self.upstream {
            Some(upstream) => (upstream.calls().await, upstream.objects().await),
            None => (Vec::new(), Vec::new()),
        };
        let options = ForkOptions { input_json: None, run: self.options };
        let fork = match rt.fork(&source, at, FORK_KEY, options).await {
            Ok(fork) => fork.run_id,
            Err(e) => {
                report.problems.push(format!("fork at boundary {at}: {e}"));
                rt.shutdown().await;
                return report;
            }
        };
        report.final_state = self.drive(&rt, &sim, &fork, &mut report).await;
        record_end(&rt, &fork, &mut report);
        if report.final_state.is_none() {
            report.problems.push(format!(
                "the fork did not finish within {} s of virtual time",
                self.time_limit.as_secs()
            ));
        } else if report.final_state.as_ref().map(durafiber_runtime::RunStatus::name)
            != baseline.final_state.as_ref().map(durafiber_runtime::RunStatus::name)
        {
            // Its output may differ: what it did after its point was done anew.
            report.problems.push(format!(
                "the fork ended as {:?}, the uninterrupted run as {:?}",
                report.final_state, baseline.final_state
            ));
        }
        if records_of(&rt, &source) != before {
            report.problems.push("the run it was forked from changed".into());
        }
        self.check_inherited(&rt, &fork, &calls_before, &objects_before, &mut report).await;
        report.events = rt.events();
        rt.shutdown().await;
        report
    }

    /// No inherited key called again; every new object one of the fork's own effects'.
    async fn check_inherited(
        &self,
        rt: &Runtime,
        fork: &RunId,
        calls_before: &[(String, String)],
        objects_before: &[(String, String, Value)],
        report: &mut CaseReport,
    ) {
        let Some(upstream) = &self.upstream else { return };
        let Ok(shown) = rt.inspect(fork).map(|i| serde_json::to_value(i).unwrap_or(Value::Null)) else {
            report.problems.push("the fork cannot be read".into());
            return;
        };
        let inherited: BTreeSet<&str> = shown["forked_from"]["inherited_effects"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let key_of = |effect: &Value| effect["idempotency_key"].as_str().unwrap_or_default().to_string();
        let (mut inherited_keys, mut own_keys) = (BTreeSet::new(), BTreeSet::new());
        for effect in shown["ledger"].as_array().into_iter().flatten() {
            match inherited.contains(effect["effect_id"].as_str().unwrap_or_default()) {
                true => inherited_keys.insert(key_of(effect)),
                false => own_keys.insert(key_of(effect)),
            };
        }
        // The children the fork started are its own, and so is what they call; those it
        // inherited (started before its point) must call nothing again.
        for (child, own) in family_of(rt, fork) {
            let keys = if own { &mut own_keys } else { &mut inherited_keys };
            let ledger = rt.inspect(&child).map(|i| i.ledger).unwrap_or_default();
            keys.extend(ledger.into_iter().map(|entry| entry.idempotency_key));
        }
        for (collection, key) in since(upstream.calls().await, calls_before, Clone::clone) {
            if inherited_keys.contains(&key) {
                report
                    .problems
                    .push(format!("an inherited effect was called again: {collection} with key {key}"));
            }
        }
        let objects = since(upstream.objects().await, objects_before, |(c, k, _)| (c.clone(), k.clone()));
        for (collection, key, body) in objects {
            *report.upstream.entry(key.clone()).or_default() += 1;
            report.requests.push((collection.clone(), body));
            if !own_keys.contains(&key) {
                report
                    .problems
                    .push(format!("an object on {collection} under a key not the fork's own: {key}"));
            }
        }
    }
}

/// Every run below `run_id` (its children, theirs…), each with whether `run_id`'s line
/// started it (true) or a fork inherited it from the run it came from (false).
fn family_of(rt: &Runtime, run_id: &RunId) -> Vec<(RunId, bool)> {
    let mut out = Vec::new();
    let mut next = vec![(run_id.clone(), true)];
    while let Some((parent, own_line)) = next.pop() {
        let Ok(shown) = rt.inspect(&parent) else { continue };
        for child in shown.children {
            let started_here = rt
                .inspect(&child.run_id)
                .ok()
                .and_then(|c| c.parent)
                .is_some_and(|p| p.parent_run_id == parent);
            let own = own_line && started_here;
            if out.iter().all(|(seen, _)| *seen != child.run_id) {
                out.push((child.run_id.clone(), own));
                next.push((child.run_id, own));
            }
        }
    }
    out
}

/// What `now` holds beyond `before`, each entry told apart by `id` and counted: an upstream
/// that lists several collections may list a new entry before old ones.
fn since<T>(now: Vec<T>, before: &[T], id: impl Fn(&T) -> (String, String)) -> Vec<T> {
    let mut old: std::collections::HashMap<(String, String), usize> = std::collections::HashMap::new();
    for entry in before {
        *old.entry(id(entry)).or_default() += 1;
    }
    now.into_iter()
        .filter(|entry| match old.get_mut(&id(entry)) {
            Some(n) if *n > 0 => {
                *n -= 1;
                false
            }
            _ => true,
        })
        .collect()
}
