//! Reading runs: status, waiting, listing, inspection, storage, alarms, approvals, output
//! streams.

use durafiber_api::Timestamp;
use durafiber_store::RunId;
use durafiber_store::{
    Store,
    tables::{
        ApprovalRecord, ApprovalRuleRecord, BudgetRecord, DeadLetter, ForkRecord, LedgerEntry, RunRecord,
        RunStatus, StashRecord, Table, VoteRecord, keys,
    },
};
use serde::{Serialize, de::DeserializeOwned};

use super::handle::Runtime;
use crate::{
    alarm,
    approval_pending::{self, PendingApproval},
    error::RuntimeError,
    json, limits,
    stream::{self, StreamChunk, StreamItem},
    types::RunState,
};

pub use durafiber_api::RunPage;

/// Everything stored about a run, for inspection. Secrets are pointers by construction.
///
/// Serialized, every stored JSON text is embedded as JSON under the field's name without
/// `_json`: the run's `input`, a completed run's `output`, the stash's `stash`, each
/// receipt's `receipt`, each payload's `payload` — objects to read, not strings holding JSON.
#[derive(Debug, Clone)]
pub struct RunInspection {
    /// The run record.
    pub run: RunRecord,
    /// Its last stash.
    pub stash: Option<StashRecord>,
    /// The agent's `STASH_VERSION` that wrote it.
    pub stash_version: Option<u32>,
    /// Its ledger.
    pub ledger: Vec<LedgerEntry>,
    /// Its pending alarms, with their cron schedules and occurrences being retried.
    pub alarms: Vec<alarm::Alarm>,
    /// Its approvals, pending and decided.
    pub approvals: Vec<ApprovalRecord>,
    /// The rules of its approvals that take more than one person, with each person's
    /// decision so far: shown in their approval as `rule` and `votes`.
    pub quorums: Vec<Quorum>,
    /// Its abandoned alarms.
    pub dead_letters: Vec<DeadLetter>,
    /// Its budget and what it has spent, if it has one (or has charged).
    pub budget: Option<BudgetRecord>,
    /// The run it was forked from, at which boundary, and what it inherited.
    pub forked_from: Option<ForkRecord>,
    /// Its trace's id, derived from the run id ([`crate::trace::trace_id_of`]).
    pub trace_id: String,
    /// Its trace in the trace UI, when `traces.ui` is configured.
    pub trace_url: Option<String>,
    /// The named limit an effect of the run waits its turn in now, in this process.
    pub waiting_on_limit: Option<String>,
    /// The run that started it as its child, and its name there.
    pub parent: Option<durafiber_store::tables::ParentRecord>,
    /// The runs it started as its children, by name, with their states.
    pub children: Vec<ChildShown>,
    /// Chunks of its output stream that a re-entered fiber emitted differently (after a
    /// deploy that changed them): the durable chunks stood; these say what the new code said.
    pub reemissions: Vec<durafiber_store::tables::ReemissionRecord>,
}

/// A child run as its parent's inspection shows it.
#[derive(Debug, Clone, Serialize)]
pub struct ChildShown {
    /// Its name among the parent's children.
    pub name: String,
    /// Its run.
    pub run_id: RunId,
    /// Its agent kind.
    pub kind: String,
    /// Its state now (`running`, `completed`, …).
    pub state: String,
}

/// One boundary of a run's history ([`Runtime::history`]): the stash written there.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize)]
pub struct HistoryEntry {
    /// The boundary: the stash's sequence number, what `fork` takes as `at`.
    pub seq: u64,
    /// The step the fiber had reached.
    pub step: String,
    /// The fiber attempt that wrote it.
    pub attempt: u32,
    /// When, ms.
    pub written_at_ms: Timestamp,
    /// The agent's `STASH_VERSION` that wrote it.
    pub stash_version: u32,
    /// The stash, as JSON.
    pub stash: serde_json::Value,
}

/// An approval that takes more than one person: its rule and the decisions so far.
#[derive(Debug, Clone)]
pub struct Quorum {
    /// The approval.
    pub approval_id: String,
    /// Who must decide it.
    pub rule: ApprovalRuleRecord,
    /// Each person's decision so far, by name.
    pub votes: Vec<VoteRecord>,
}

impl Serialize for RunInspection {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut approvals = serde_json::to_value(&self.approvals).map_err(serde::ser::Error::custom)?;
        for approval in approvals.as_array_mut().into_iter().flatten() {
            let id = approval["approval_id"].as_str().unwrap_or_default();
            if let Some(quorum) = self.quorums.iter().find(|q| q.approval_id == id) {
                approval["rule"] = serde_json::json!(quorum.rule);
                approval["votes"] = serde_json::json!(quorum.votes);
            }
        }
        let fields = serde_json::json!({
            "run": self.run, "stash": self.stash, "stash_version": self.stash_version, "ledger": self.ledger,
            "alarms": self.alarms,
            "approvals": approvals, "dead_letters": self.dead_letters, "budget": self.budget,
            "trace_id": self.trace_id, "trace_url": self.trace_url, "forked_from": self.forked_from,
            "waiting_on_limit": self.waiting_on_limit, "parent": self.parent, "children": self.children,
            "reemissions": self.reemissions,
        });
        embed_json_texts(fields).serialize(serializer)
    }
}

/// Replaces each `<name>_json` field holding JSON text with `<name>` holding that JSON.
/// What is embedded is user data and is left as it is, whatever its own keys are called.
fn embed_json_texts(value: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(key, field)| match (key.strip_suffix("_json"), &field) {
                    (Some(name), Value::String(text)) => match serde_json::from_str::<Value>(text) {
                        Ok(embedded) => (name.to_string(), embedded),
                        Err(_) => (key, field),
                    },
                    _ => (key, embed_json_texts(field)),
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(embed_json_texts).collect()),
        other => other,
    }
}

/// Which runs `list` returns.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// Only runs in this state.
    pub state: Option<RunState>,
    /// Only runs of this kind.
    pub kind: Option<String>,
    /// Start after this run id (the previous page's `next`).
    pub after: Option<RunId>,
    /// Page size, at most [`limits::LIST_PAGE_MAX`].
    pub limit: usize,
    /// Only open runs whose last stash is older than this `STASH_VERSION`: the runs a deploy
    /// of that version still has to carry (`Agent::upgrade_stash`).
    pub stash_version_below: Option<u32>,
}

/// Every record of `table` that belongs to run `id`.
fn scan_all<V: DeserializeOwned>(store: &Store, table: Table<V>, id: &str) -> Result<Vec<V>, RuntimeError> {
    let mut out = Vec::new();
    for (_, record) in store.scan(&table.of_run(id), None, usize::MAX)? {
        out.push(record?);
    }
    Ok(out)
}

impl Runtime {
    /// The run's current state.
    pub fn status(&self, run_id: &RunId) -> Result<RunStatus, RuntimeError> {
        Ok(self.shared.load_run(run_id)?.status)
    }

    /// The run record.
    pub fn run(&self, run_id: &RunId) -> Result<RunRecord, RuntimeError> {
        self.shared.load_run(run_id)
    }

    /// Waits until the run is terminal and returns its final state.
    pub async fn wait(&self, run_id: &RunId) -> Result<RunStatus, RuntimeError> {
        let mut changes = self.shared.signals.status_version.subscribe();
        loop {
            let status = self.status(run_id)?;
            if status.is_terminal() {
                return Ok(status);
            }
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return Err(RuntimeError::ShuttingDown) },
                () = self.shared.foreign_writes_poll() => {}
            }
        }
    }

    /// Waits until `pred` holds for the run's state (tests and tools; no polling by time).
    pub async fn wait_for(
        &self,
        run_id: &RunId,
        pred: impl Fn(&RunStatus) -> bool,
    ) -> Result<RunStatus, RuntimeError> {
        let mut changes = self.shared.signals.status_version.subscribe();
        loop {
            let status = self.status(run_id)?;
            if pred(&status) {
                return Ok(status);
            }
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return Err(RuntimeError::ShuttingDown) },
                () = self.shared.foreign_writes_poll() => {}
            }
        }
    }

    /// Lists runs, filtered and paged, in run-id order.
    pub fn list(&self, filter: &ListFilter) -> Result<RunPage, RuntimeError> {
        let limit = filter.limit.clamp(1, limits::LIST_PAGE_MAX);
        let mut after = filter.after.as_ref().map(|a| keys::run(a));
        let mut runs = Vec::new();
        loop {
            let page = self.shared.store.scan(&keys::RUNS.all(), after.as_ref(), limit)?;
            let exhausted = page.len() < limit;
            for (key, run) in page {
                after = Some(key);
                let run = match run {
                    Ok(run) => run,
                    Err(e) => {
                        tracing::error!(error = %e, "unreadable run record skipped in list");
                        continue;
                    }
                };
                let state_ok = filter.state.is_none_or(|s| s == run.status.state());
                let kind_ok = filter.kind.as_deref().is_none_or(|k| k == run.kind);
                let version_ok = match filter.stash_version_below {
                    None => true,
                    Some(below) => {
                        !run.status.is_terminal()
                            && self.stash_version(&run.run_id)?.is_some_and(|v| v < below)
                    }
                };
                if state_ok && kind_ok && version_ok {
                    runs.push(run);
                    if runs.len() == limit {
                        let next = runs.last().map(|r| r.run_id.clone());
                        return Ok(RunPage { runs, next });
                    }
                }
            }
            if exhausted {
                return Ok(RunPage { runs, next: None });
            }
        }
    }

    /// The `STASH_VERSION` of the run's last stash; `None` before its first stash.
    pub fn stash_version(&self, run_id: &RunId) -> Result<Option<u32>, RuntimeError> {
        Ok(crate::kernel::stash_record::read(&self.shared.store, run_id)?.map(|s| s.version))
    }

    /// Everything stored about a run.
    pub fn inspect(&self, run_id: &RunId) -> Result<RunInspection, RuntimeError> {
        let store = &self.shared.store;
        let run = self.shared.load_run(run_id)?;
        let stored = crate::kernel::stash_record::read(store, run_id)?;
        Ok(RunInspection {
            stash_version: stored.as_ref().map(|s| s.version),
            stash: stored.map(|s| s.record),
            ledger: scan_all(store, keys::LEDGER, run_id)?,
            alarms: alarm::list(&self.shared, run_id)?,
            approvals: scan_all(store, keys::APPROVALS, run_id)?,
            quorums: self.quorums(run_id)?,
            dead_letters: scan_all(store, keys::DEAD_LETTERS, run_id)?,
            budget: crate::kernel::spend::stored(store, run_id)?,
            forked_from: store.get(&keys::fork(run_id))?,
            trace_id: crate::trace::trace_id_of(run_id),
            trace_url: crate::trace::ui_link(&self.shared.config.traces, run_id),
            waiting_on_limit: self.shared.controls.limiters.waiting_on(run_id),
            parent: crate::kernel::lineage::parent_of(&self.shared, run_id)?,
            reemissions: scan_all(store, keys::STREAM_REEMISSIONS, run_id)?,
            children: crate::kernel::lineage::children_of(&self.shared, run_id)?
                .into_iter()
                .map(|(name, c)| {
                    let state = self.shared.load_run(&c.child_run_id).map(|r| r.status.name().to_string());
                    ChildShown {
                        name,
                        run_id: c.child_run_id,
                        kind: c.kind,
                        state: state.unwrap_or_else(|_| "deleted".into()),
                    }
                })
                .collect(),
            run,
        })
    }

    /// The boundaries the run's history keeps (the last `history_max`), oldest first.
    pub fn history(&self, run_id: &RunId) -> Result<Vec<HistoryEntry>, RuntimeError> {
        self.shared.load_run(run_id)?;
        let entries =
            crate::kernel::stash_record::history(&self.shared.store, run_id, self.shared.config.history_max)?;
        Ok(entries
            .into_iter()
            .map(|entry| HistoryEntry {
                seq: entry.stash.seq,
                stash: serde_json::from_str(&entry.stash.stash_json).unwrap_or(serde_json::Value::Null),
                step: entry.stash.step,
                attempt: entry.stash.attempt,
                written_at_ms: entry.stash.written_at_ms,
                stash_version: entry.version,
            })
            .collect())
    }

    /// The run's approvals that take more than one person, with their decisions so far.
    fn quorums(&self, run_id: &RunId) -> Result<Vec<Quorum>, RuntimeError> {
        let store = &self.shared.store;
        let mut quorums = Vec::new();
        for (key, rule) in store.scan(&keys::APPROVAL_RULES.of_run(run_id), None, usize::MAX)? {
            let approval_id = key.last_part().unwrap_or_default().to_string();
            let votes = crate::approval::votes_of(&self.shared, run_id, &approval_id)?;
            quorums.push(Quorum { approval_id, rule: rule?, votes });
        }
        Ok(quorums)
    }

    /// Decodes a run's output once it is `Completed`.
    pub fn output<T: DeserializeOwned>(&self, run_id: &RunId) -> Result<Option<T>, RuntimeError> {
        match self.status(run_id)? {
            RunStatus::Completed { output_json } => {
                Ok(Some(json::parse(&output_json).map_err(|e| RuntimeError::InvalidInput(e.into()))?))
            }
            _ => Ok(None),
        }
    }

    /// One page of a run's storage under `prefix`, in key order, after `start_after`: keys
    /// and values as JSON text. For inspection; the run itself reads `ctx.storage()`.
    pub fn storage_list(
        &self,
        run_id: &RunId,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, String)>, RuntimeError> {
        self.shared.load_run(run_id)?;
        crate::storage::list_json(&self.shared.store, run_id, prefix, start_after, limit)
    }

    /// A run's pending alarms, the runtime's own among them: an approval's escalation, a
    /// durable sleep's wake, an event wait's timeout are marked by `AlarmRecord::system`
    /// (and named `escalate:<id>`, `sleep:<name>`, `event:<name>`).
    /// Each comes with its next due time, its cron schedule if it has one, and its failed
    /// occurrences being retried.
    pub fn alarms(&self, run_id: &RunId) -> Result<Vec<alarm::Alarm>, RuntimeError> {
        self.shared.load_run(run_id)?;
        alarm::list(&self.shared, run_id)
    }

    /// At most `limit` (up to [`limits::LIST_PAGE_MAX`]) of a run's alarms, as
    /// [`Runtime::alarms`] gives them, in the order of their names after alarm `after`. A
    /// page shorter than `limit` is the last.
    pub fn alarms_page(
        &self,
        run_id: &RunId,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<alarm::Alarm>, RuntimeError> {
        self.shared.load_run(run_id)?;
        alarm::list_page(&self.shared, run_id, after, limit.clamp(1, limits::LIST_PAGE_MAX))
    }

    /// The run's output stream from sequence number `from_seq` on: every durable chunk, in
    /// order, then each new one as it becomes durable; it ends after the last chunk once the
    /// run has ended. A client that reconnects with the sequence number after the last chunk
    /// it got receives each durable chunk exactly once.
    ///
    /// Between durable chunks come the partial chunks of a streaming effect's call running on
    /// this node ([`StreamItem::Partial`], see `Ctx::effect_stream`), and a
    /// [`StreamItem::Reset`] when such a call's chunks are taken back. A durable chunk replaces
    /// every partial chunk shown before it. `.filter_map(|i| async { i.map(StreamItem::durable).transpose() })`
    /// keeps only the durable ones.
    pub fn stream(
        &self,
        run_id: &RunId,
        from_seq: u64,
    ) -> Result<futures::stream::BoxStream<'static, Result<StreamItem, RuntimeError>>, RuntimeError> {
        self.shared.load_run(run_id)?;
        Ok(Box::pin(stream::follow(self.shared.clone(), run_id.clone(), from_seq)))
    }

    /// Up to `limit` chunks of the run's output stream from `from_seq` on, as stored now.
    pub fn stream_chunks(
        &self,
        run_id: &RunId,
        from_seq: u64,
        limit: usize,
    ) -> Result<Vec<StreamChunk>, RuntimeError> {
        self.shared.load_run(run_id)?;
        stream::read(&self.shared, run_id, from_seq, limit)
    }

    /// Abandoned alarms across runs, in run order, at most `limit` (up to
    /// [`limits::LIST_PAGE_MAX`]).
    pub fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, RuntimeError> {
        let page = self.shared.store.scan::<DeadLetter>(
            &keys::DEAD_LETTERS.all(),
            None,
            limit.clamp(1, limits::LIST_PAGE_MAX),
        )?;
        page.into_iter().map(|(_, d)| d.map_err(RuntimeError::from)).collect()
    }

    /// Pending approvals, with the payload the run showed and its hash; of one run or all.
    /// Across many runs, [`Runtime::pending_approvals_page`] reads them a page at a time.
    pub fn pending_approvals(&self, run_id: Option<&RunId>) -> Result<Vec<PendingApproval>, RuntimeError> {
        approval_pending::pending(&self.shared, run_id.map(RunId::as_str))
    }

    /// At most `limit` (up to [`limits::LIST_PAGE_MAX`]) pending approvals across runs, runs
    /// in the order they were started, after `after` — the run id and approval id of the
    /// previous page's last one. A page shorter than `limit` is the last.
    pub fn pending_approvals_page(
        &self,
        after: Option<(&RunId, &str)>,
        limit: usize,
    ) -> Result<Vec<PendingApproval>, RuntimeError> {
        let after = after.map(|(run_id, approval_id)| (run_id.as_str(), approval_id));
        approval_pending::pending_page(&self.shared, after, limit.clamp(1, limits::LIST_PAGE_MAX))
    }

    /// The agent kinds this runtime hosts, in order.
    pub fn kinds(&self) -> Vec<String> {
        let mut kinds: Vec<String> = self.shared.agents.kinds.keys().cloned().collect();
        kinds.sort();
        kinds
    }

    /// The JSON Schema of `kind`'s input, when its agent gives one ([`crate::Agent::input_schema`]).
    pub fn input_schema(&self, kind: &str) -> Option<serde_json::Value> {
        self.shared.agents.agent(kind).ok()?.input_schema()
    }

    /// How the agent of `kind` would like approval `approval_id`'s `payload` shown
    /// ([`crate::Agent::approval_view`]); `None` when it says nothing, the kind is not
    /// registered, or its code panicked (a reviewer's screen never fails on it).
    pub fn approval_view(
        &self,
        kind: &str,
        approval_id: &str,
        payload: &serde_json::Value,
    ) -> Option<crate::approval_view::ApprovalView> {
        let agent = self.shared.agents.agent(kind).ok()?;
        let shown = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            agent.approval_view(approval_id, payload)
        }));
        match shown {
            Ok(view) => view,
            Err(_) => {
                tracing::warn!(kind, approval_id, "approval_view panicked; showing the payload's own fields");
                None
            }
        }
    }
}
