//! Playing one case: a fresh simulated disk, the trouble the case asks for, a new process
//! after a crash, and the case's end compared with the baseline's.

use durafiber_runtime::StartRequest;
use durafiber_runtime::Timestamp;
use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use durafiber_runtime::{Agent, Boundary, CrashHook, RunId, RunStatus, Runtime, RuntimeConfig};
use durafiber_store::SimBackend;
use parking_lot::Mutex;
use serde_json::Value;

use super::{AgentCheck, CaseReport, CrashPoint, Trouble, Unplayable};
use crate::SIM_EPOCH_MS;

/// Storage read per page when a case's end is recorded.
const STORAGE_PAGE: usize = 1_000;
/// Chunks read per page when a case's end is recorded.
const STREAM_PAGE: usize = 1_000;

impl<A: Agent + Clone> AgentCheck<A> {
    /// Plays one case; returns its report and how many store writes it made.
    pub(super) async fn play(
        &self,
        name: &str,
        crash_point: Option<CrashPoint>,
        trouble: Trouble,
        baseline: Option<&CaseReport>,
        record_boundaries: Option<Arc<Mutex<Vec<Boundary>>>>,
    ) -> (CaseReport, u64) {
        if let Some(upstream) = &self.upstream {
            upstream.reset().await;
        }
        let mut report = CaseReport::named(name, crash_point);
        let Some(input) = &self.input else {
            report.problems.push("no input: call .input(&input)".into());
            return (report, 0);
        };
        let sim = SimBackend::new();
        if let Some(n) = trouble.lose_write {
            sim.crash_at(durafiber_store::SimCrash::AfterApply(n));
        }
        let mut config = self.config.clone();
        config.storage_writes_sync |= trouble.storage_at_once;
        if let Some(seed) = trouble.chaos_seed {
            config = RuntimeConfig { seed, chaos_evict_rate: 0.3, ..config };
        }
        let hook = case_hook(&sim, &trouble, record_boundaries);
        let rt = match self.open(&sim, Timestamp::from_millis(SIM_EPOCH_MS), config.clone(), Some(hook)).await
        {
            Ok(rt) => rt,
            Err(e) => {
                report.problems.push(e.into());
                return (report, 0);
            }
        };
        let started =
            rt.start_run(StartRequest::new(A::KIND, RUN_KEY, input.clone()).with_options(self.options)).await;
        let run_id = started.as_ref().ok().map(|s| s.run_id.clone());
        let mut status = None;
        if let Some(id) = &run_id {
            if trouble.events_early {
                self.send_events(&rt, id, None).await;
            }
            status = self.drive(&rt, &sim, id, &mut report).await;
        }
        let (writes, _) = sim.counts();
        let mut restarted = Restarted { rt, run_id, status };
        if let Err(e) =
            self.restart_while_crashed(&sim, &config, &trouble, input, &mut restarted, &mut report).await
        {
            report.problems.push(format!("after the crash, {e}"));
            return (report, writes);
        }
        let Restarted { rt, run_id, status } = restarted;
        if let Some(id) = &run_id {
            record_end(&rt, id, &mut report);
        }
        report.events = rt.events();
        rt.shutdown().await;
        report.final_state = status;
        self.judge(&mut report, &trouble, baseline).await;
        (report, writes)
    }

    /// While the store is crashed, the process dies with it and a new one opens what the disk
    /// kept — with the next deploy's code, in a deploy case, which may itself be killed once at
    /// its first boundary (the upgraded stash's write) — starts the run again with the same key
    /// (a caller that saw no answer) and drives it.
    async fn restart_while_crashed(
        &self,
        sim: &SimBackend,
        config: &RuntimeConfig,
        trouble: &Trouble,
        input: &Value,
        restarted: &mut Restarted,
        report: &mut CaseReport,
    ) -> Result<(), Unplayable> {
        let mut restarts = 0u32;
        while sim.is_crashed() {
            let now = restarted.rt.now();
            restarted.rt.shutdown().await;
            sim.revive();
            restarts += 1;
            let mut reopen_config = config.clone();
            let mut hook = None;
            if trouble.deploy {
                reopen_config.strict_streams = false;
                if trouble.crash_after_deploy && restarts == 1 {
                    let sim = sim.clone();
                    hook = Some(Arc::new(move |_: &RunId, _: &Boundary| {
                        sim.crash();
                        false
                    }) as CrashHook);
                }
            }
            restarted.rt = self.reopen(sim, now, reopen_config, hook, trouble.deploy).await?;
            let rt = &restarted.rt;
            let again = rt
                .start_run(StartRequest::new(A::KIND, RUN_KEY, input.clone()).with_options(self.options))
                .await;
            match (&restarted.run_id, again) {
                (Some(id), Ok(out)) if out.run_id != *id => {
                    report.problems.push(format!("the key's run changed from {id} to {}", out.run_id));
                }
                (_, Ok(out)) => restarted.run_id = Some(out.run_id),
                // Killed again while it opened (a deploy case's first boundary): the next
                // process starts again.
                (_, Err(_)) if sim.is_crashed() => continue,
                (_, Err(e)) => report.problems.push(format!("start after the crash: {e}")),
            }
            if let Some(id) = &restarted.run_id {
                if trouble.events_early {
                    self.send_events(rt, id, None).await;
                }
                restarted.status = self.drive(rt, sim, id, report).await;
            }
        }
        Ok(())
    }

    /// The case's end against the baseline's: its state, the upstream's objects, its records;
    /// after a deploy, its state only (new code may answer otherwise and say other things
    /// after its point; it must end the way the run did, escalating nothing, paying nothing
    /// twice).
    async fn judge(&self, report: &mut CaseReport, trouble: &Trouble, baseline: Option<&CaseReport>) {
        if report.final_state.is_none() {
            report
                .problems
                .push(format!("did not finish within {} s of virtual time", self.time_limit.as_secs()));
        }
        self.count_upstream(report, baseline).await;
        if let Some(baseline) = baseline
            && report.final_state.is_some()
        {
            let name = |s: &Option<RunStatus>| s.as_ref().map(RunStatus::name);
            if trouble.deploy && name(&report.final_state) != name(&baseline.final_state) {
                report.problems.push(format!(
                    "after the deploy it ended as {:?}, the uninterrupted run as {:?}",
                    report.final_state, baseline.final_state
                ));
            }
            if !trouble.deploy {
                if !self.same_end(&report.final_state, &baseline.final_state) {
                    report.problems.push(format!(
                        "ended as {:?}, the uninterrupted run as {:?}",
                        report.final_state, baseline.final_state
                    ));
                }
                self.compare_records(report, baseline);
            }
        }
        if !report.liveness_violations.is_empty() {
            report.problems.push(format!("left behind: {:?}", report.liveness_violations));
        }
    }

    /// Whether a case ended as the baseline did: the same state, and an output that matches.
    fn same_end(&self, case: &Option<RunStatus>, baseline: &Option<RunStatus>) -> bool {
        match (case, baseline, &self.output_matches) {
            (
                Some(RunStatus::Completed { output_json: a }),
                Some(RunStatus::Completed { output_json: b }),
                Some(same),
            ) => match (serde_json::from_str::<Value>(a), serde_json::from_str::<Value>(b)) {
                (Ok(a), Ok(b)) => same(&b, &a),
                _ => false,
            },
            _ => case == baseline,
        }
    }

    /// Advances virtual time, deciding approvals, until the run ends, the store crashes or
    /// the time limit passes.
    pub(super) async fn drive(
        &self,
        rt: &Runtime,
        sim: &SimBackend,
        run_id: &RunId,
        report: &mut CaseReport,
    ) -> Option<RunStatus> {
        let step = Duration::from_secs(1);
        let steps = self.time_limit.as_secs().max(1);
        for i in 0..=steps {
            // Settle first, so the liveness rule sees the run at rest, not mid-activation.
            let _ = rt.advance(if i == 0 { Duration::ZERO } else { step }).await;
            if sim.is_crashed() {
                return None;
            }
            if let Ok(violations) = rt.check_liveness()
                && !sim.is_crashed()
            {
                report
                    .liveness_violations
                    .extend(violations.iter().map(|v| format!("{} ({})", v.run_id, v.status.name())));
            }
            match rt.status(run_id) {
                Ok(s) if s.is_terminal() => return Some(s),
                Ok(RunStatus::WaitingEvent { name }) => self.send_events(rt, run_id, Some(&name)).await,
                Ok(RunStatus::WaitingApproval { .. }) => {
                    if let Some(decide) = &self.approver
                        && let Ok(pending) = rt.pending_approvals(Some(run_id))
                    {
                        for p in pending {
                            let decision = decide(&p);
                            if p.required <= 1 {
                                let _ = rt.approve(run_id, &p.approval_id, &p.payload_hash, decision).await;
                                continue;
                            }
                            // A pause more than one person decides: one more of them a step.
                            let next = self.decider_after(&p);
                            let _ =
                                rt.approve_as(run_id, &p.approval_id, &p.payload_hash, decision, &next).await;
                        }
                    }
                }
                _ => {}
            }
        }
        rt.status(run_id).ok().filter(RunStatus::is_terminal)
    }

    /// Sends the events given with `send_event` (only `name`, when given), each under one
    /// idempotency key, so that a send repeated after a crash is a duplicate.
    async fn send_events(&self, rt: &Runtime, run_id: &RunId, name: Option<&str>) {
        for (event, payload) in &self.events {
            if name.is_none_or(|name| name == event) {
                let key = format!("agent-check:{event}");
                let _ = rt.send_event_json(run_id, event, &payload.to_string(), Some(&key)).await;
            }
        }
    }

    /// Adds a problem for each way the case's stream or storage differs from the baseline's.
    fn compare_records(&self, report: &mut CaseReport, baseline: &CaseReport) {
        if report.stream != baseline.stream {
            let at = report.stream.iter().zip(&baseline.stream).take_while(|(a, b)| a == b).count();
            report.problems.push(format!(
                "output stream differs from the uninterrupted run's from chunk {at}: {:?} against {:?}",
                report.stream.get(at..).unwrap_or_default(),
                baseline.stream.get(at..).unwrap_or_default()
            ));
        }
        let same = match &self.storage_matches {
            Some(same) => same(&as_values(&baseline.storage), &as_values(&report.storage)),
            None => report.storage == baseline.storage,
        };
        if !same {
            report.problems.push(format!(
                "storage differs from the uninterrupted run's: {:?} against {:?}",
                report.storage, baseline.storage
            ));
        }
    }

    async fn count_upstream(&self, report: &mut CaseReport, baseline: Option<&CaseReport>) {
        let Some(upstream) = &self.upstream else { return };
        for (collection, key, body) in upstream.objects().await {
            *report.upstream.entry(key).or_default() += 1;
            report.requests.push((collection, body));
        }
        let Some(baseline) = baseline else { return };
        let count = |requests: &[(String, Value)]| {
            let mut n: BTreeMap<(String, String), (usize, Value)> = BTreeMap::new();
            for (collection, body) in requests {
                n.entry((collection.clone(), body.to_string())).or_insert((0, body.clone())).0 += 1;
            }
            n
        };
        let (got, want) = (count(&report.requests), count(&baseline.requests));
        for ((collection, text), (n, body)) in &got {
            let expected = want.get(&(collection.clone(), text.clone())).map_or(0, |w| w.0);
            for _ in expected..*n {
                report.duplicated_effects.push((collection.clone(), body.clone()));
            }
        }
        for ((collection, text), (n, body)) in &want {
            let made = got.get(&(collection.clone(), text.clone())).map_or(0, |g| g.0);
            for _ in made..*n {
                report.missing_effects.push((collection.clone(), body.clone()));
            }
        }
        for (collection, body) in &report.duplicated_effects {
            report.problems.push(format!("effect on {collection} made again: {body}"));
        }
        if report.final_state.is_some() {
            for (collection, body) in &report.missing_effects {
                report.problems.push(format!("effect on {collection} missing: {body}"));
            }
        }
    }
}

/// The idempotency key every case starts its run with.
const RUN_KEY: &str = "checked-run";

/// The process a case is on, the run it started and where the run ended.
struct Restarted {
    rt: Runtime,
    run_id: Option<RunId>,
    status: Option<RunStatus>,
}

/// The crash hook of a case's first process: it records each boundary passed (for a dry
/// run), crashes the store after the n-th when asked, and evicts at the n-th when asked.
fn case_hook(sim: &SimBackend, trouble: &Trouble, record: Option<Arc<Mutex<Vec<Boundary>>>>) -> CrashHook {
    let (sim, passed, trouble) = (sim.clone(), Arc::new(AtomicUsize::new(0)), trouble.clone());
    Arc::new(move |_, point| {
        let n = passed.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some(record) = &record {
            record.lock().push(point.clone());
        }
        if trouble.crash_after_boundary == Some(n) {
            sim.crash();
        }
        trouble.evict_at_boundary == Some(n)
    })
}

/// Records the run's output stream and storage as they are at its end.
pub(super) fn record_end(rt: &Runtime, run_id: &RunId, report: &mut CaseReport) {
    loop {
        let from = report.stream.len() as u64;
        let Ok(page) = rt.stream_chunks(run_id, from, STREAM_PAGE) else { break };
        let last = page.len() < STREAM_PAGE;
        report.stream.extend(page.into_iter().map(|c| c.data_json));
        if last {
            break;
        }
    }
    let mut after: Option<String> = None;
    while let Ok(page) = rt.storage_list(run_id, "", after.as_deref(), STORAGE_PAGE) {
        let last = page.len() < STORAGE_PAGE;
        after = page.last().map(|(key, _)| key.clone());
        report.storage.extend(page);
        if last {
            break;
        }
    }
}

/// Storage values as JSON, for a comparison the caller wrote.
fn as_values(storage: &BTreeMap<String, String>) -> BTreeMap<String, Value> {
    storage
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.clone()))))
        .collect()
}
