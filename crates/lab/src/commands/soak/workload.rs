//! The soak's steady work, a tick at a time: a refund started (each under a key of its own,
//! started again until a server answers it), every pending approval given, now and then a
//! completed refund forked at its last boundary, a step run started and an older one
//! cancelled, a settled run deleted. What it asked for is remembered, so the end can check
//! every refund against the upstream.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use durafiber_client::{Client, ClientError};
use durafiber_runtime::RunId;
use durafiber_testkit::upstream::Upstream;
use serde_json::{Value, json};

use super::SoakReport;

/// The last boundary of a refund: after both its effects.
const LAST_STEP: &str = "emailed";

pub(super) struct Workload {
    upstream: String,
    rate: u32,
    ticks: u64,
    /// Refund keys not answered yet (the server died under the call), with their input.
    unanswered: BTreeMap<String, Value>,
    /// Every refund's run id, by key.
    refunds: BTreeMap<String, RunId>,
    /// Refunds forked (by source run id), and the forks' ids.
    forked: BTreeSet<RunId>,
    forks: Vec<RunId>,
    /// Step runs started and not cancelled yet, oldest first.
    steps: Vec<RunId>,
    approvals: usize,
    cancelled: usize,
    deleted: usize,
}

impl Workload {
    pub(super) fn new(upstream: String, rate: u32) -> Workload {
        Workload {
            upstream,
            rate: rate.max(1),
            ticks: 0,
            unanswered: BTreeMap::new(),
            refunds: BTreeMap::new(),
            forked: BTreeSet::new(),
            forks: Vec::new(),
            steps: Vec::new(),
            approvals: 0,
            cancelled: 0,
            deleted: 0,
        }
    }

    /// The time between ticks.
    pub(super) fn pause(&self) -> Duration {
        Duration::from_millis(1_000 / u64::from(self.rate))
    }

    /// One tick of work on a live server.
    pub(super) async fn tick(&mut self, client: &Client) {
        self.ticks += 1;
        // Numbered to sort in the order started.
        let key = format!("refund-{:08}", self.ticks);
        let input = json!({"order_id": format!("ord_{:08}", self.ticks), "amount_cents": 100 + self.ticks % 900,
            "customer_email": "soak@example.com", "upstream": self.upstream, "api_key": null});
        self.unanswered.insert(key, input);
        for (key, input) in self.unanswered.clone() {
            let body = json!({"kind": "refund", "input": input});
            let Ok(answer) = client.post_json("/runs", &body, Some(&key)).await else { break };
            if let Some(id) = answer["run_id"].as_str() {
                self.refunds.insert(key.clone(), RunId::from(id));
                self.unanswered.remove(&key);
            }
        }
        self.approve(client).await;
        if self.ticks.is_multiple_of(5) {
            self.steps_and_cancel(client).await;
        }
        if self.ticks.is_multiple_of(7) {
            self.fork_one(client).await;
        }
        if self.ticks.is_multiple_of(11) {
            self.delete_one(client).await;
        }
    }

    /// Approves every pending refund, quoting the hash it was shown.
    async fn approve(&mut self, client: &Client) {
        let Ok(pending) = client.approvals().await else { return };
        for p in pending {
            let body = json!({"payload_hash": p.payload_hash, "approved": true, "comment": "soak"});
            let path = format!("/runs/{}/approvals/{}", p.run_id, p.approval_id);
            if client.post_json(&path, &body, None).await.is_ok() {
                self.approvals += 1;
            }
        }
    }

    /// Starts a step run that would take minutes, and cancels the oldest one started.
    async fn steps_and_cancel(&mut self, client: &Client) {
        let key = format!("steps-{}", self.ticks);
        let body = json!({"kind": "steps", "input": {"steps": 10_000, "pause_ms": 100}});
        if let Ok(answer) = client.post_json("/runs", &body, Some(&key)).await
            && let Some(id) = answer["run_id"].as_str()
        {
            self.steps.push(RunId::from(id));
        }
        if self.steps.len() > 3 {
            let oldest = self.steps.remove(0);
            if client.cancel(&oldest, "soak").await.is_ok() {
                self.cancelled += 1;
            } else {
                self.steps.insert(0, oldest);
            }
        }
    }

    /// Forks a completed refund not forked yet, at its last boundary: it inherits both
    /// effects and pays for neither again.
    async fn fork_one(&mut self, client: &Client) {
        // The newest first: the oldest have gone with retention.
        let candidates: Vec<RunId> =
            self.refunds.values().rev().filter(|id| !self.forked.contains(*id)).take(20).cloned().collect();
        for run_id in candidates {
            let history = match client.get_json(&format!("/runs/{run_id}/history")).await {
                Ok(history) => history,
                Err(ClientError::Api { status: 404, .. }) => {
                    self.forked.insert(run_id);
                    continue;
                }
                Err(_) => return,
            };
            let last = history.as_array().into_iter().flatten().find(|h| h["step"] == LAST_STEP);
            let Some(at) = last.and_then(|h| h["seq"].as_u64()) else { continue };
            self.forked.insert(run_id.clone());
            let key = format!("fork-{run_id}");
            let answer =
                client.post_json(&format!("/runs/{run_id}/fork"), &json!({"at": at}), Some(&key)).await;
            if let Some(id) = answer.ok().and_then(|a| a["run_id"].as_str().map(RunId::from)) {
                self.forks.push(id);
            }
            return;
        }
    }

    /// Deletes the oldest fork that has settled (retention deletes the rest).
    async fn delete_one(&mut self, client: &Client) {
        let Some(fork) = self.forks.first().cloned() else { return };
        match client.delete_run(&fork).await {
            Ok(_) => {
                self.forks.remove(0);
                self.deleted += 1;
            }
            // Gone already: retention, or a delete whose answer a kill cut.
            Err(ClientError::Api { status: 404, .. }) => {
                self.forks.remove(0);
            }
            // Still going, or the server is down: asked again later.
            Err(_) => {}
        }
    }

    /// On the last server: every refund started and approved, and settled.
    pub(super) async fn finish(&mut self, client: &Client, within: Duration) {
        let deadline = Instant::now() + within;
        for run_id in std::mem::take(&mut self.steps) {
            if client.cancel(&run_id, "soak ends").await.is_ok() {
                self.cancelled += 1;
            }
        }
        while Instant::now() < deadline {
            for (key, input) in self.unanswered.clone() {
                let body = json!({"kind": "refund", "input": input});
                if let Ok(answer) = client.post_json("/runs", &body, Some(&key)).await
                    && let Some(id) = answer["run_id"].as_str()
                {
                    self.refunds.insert(key.clone(), RunId::from(id));
                    self.unanswered.remove(&key);
                }
            }
            self.approve(client).await;
            let mut open = 0;
            for state in ["accepted", "running", "waiting_approval"] {
                open += super::sample::metric(client, &format!("durafiber_runs{{state=\"{state}\"}}")).await;
            }
            if self.unanswered.is_empty() && open == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Every refund against the upstream: one refund object and one email each.
    pub(super) fn score(&self, upstream: &Upstream, report: &mut SoakReport) {
        let refunds = upstream.objects("refunds");
        let emails = upstream.objects("emails");
        let mut refunds_by_order: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for r in &refunds {
            let order = r["request"]["order_id"].as_str().unwrap_or_default().to_string();
            refunds_by_order.entry(order).or_default().push(r["id"].as_str().unwrap_or_default().to_string());
        }
        let mut emails_by_refund: BTreeMap<String, usize> = BTreeMap::new();
        for e in &emails {
            *emails_by_refund
                .entry(e["request"]["refund_id"].as_str().unwrap_or_default().to_string())
                .or_default() += 1;
        }
        for key in self.refunds.keys() {
            let order = format!("ord_{}", key.trim_start_matches("refund-"));
            let made = refunds_by_order.get(&order).map_or(&[][..], Vec::as_slice);
            let mailed: Vec<usize> =
                made.iter().map(|id| emails_by_refund.get(id).copied().unwrap_or(0)).collect();
            if made.is_empty() || mailed.contains(&0) {
                report.lost_effects += 1;
            }
            if made.len() > 1 || mailed.iter().any(|n| *n > 1) {
                report.repeated_effects += 1;
            }
        }
        report.refunds = self.refunds.len();
        report.approvals = self.approvals;
        report.forks = self.forks.len() + self.deleted;
        report.cancelled = self.cancelled;
        report.deleted = self.deleted;
    }
}
