//! The API's calls, one method each: runs, events, approvals, alarms, storage, streams and
//! tokens, each answer read into its type. How a request is sent, retried and refused is
//! the crate root's.

use std::time::{Duration, Instant};

use durafiber_api::{
    Alarm, ApproveOutcome, DurabilityMode, PendingApproval, RunId, RunPage, SendOutcome, StartOutcome,
    StreamItem,
};
#[cfg(feature = "agents")]
use durafiber_runtime::Agent;
use futures::Stream;
use serde::{Serialize, de::DeserializeOwned};
use serde_json::json;

use crate::{
    Cancelled, Client, ClientError, EventSent, Health, ListQuery, PAGE_MAX, Reply, RunDeleted, RunView,
    StartOptions, Status, StoragePage, TokenCreated, TokenRevoked, TokenShown, WAIT_POLL, sse,
};

impl Client {
    /// `GET /health`.
    pub async fn health(&self) -> Result<Health, ClientError> {
        self.typed(self.get_json("/health").await).await
    }

    /// Starts a run of `kind` under the idempotency `key`: the same key and input return the
    /// same run (`accepted == false`); the same key with another input is
    /// [`ApiErrorKind::KeyConflict`](crate::ApiErrorKind::KeyConflict).
    pub async fn start(
        &self,
        kind: &str,
        key: &str,
        input: &impl Serialize,
        options: &StartOptions,
    ) -> Result<StartOutcome, ClientError> {
        let input = serde_json::to_value(input).map_err(|e| ClientError::Encode(e.to_string()))?;
        let budget = options.budget.map(|b| {
            json!({
                "effects_max": b.effects_max,
                "cost_units_max": b.cost_units_max,
                "wall_time_max": b.wall_time_max.map(|d| format!("{}ms", d.as_millis())),
                "recoveries_max": b.recoveries_max,
            })
        });
        let body = json!({
            "kind": kind,
            "input": input,
            "options": {
                "durability": options.durability.map(DurabilityMode::name),
                "fiber_keep_alive": options.fiber_keep_alive,
                "budget": budget,
            },
        });
        self.typed(self.post_json("/runs", &body, Some(key)).await).await
    }

    /// Starts a run of agent `A` with its typed input.
    #[cfg(feature = "agents")]
    pub async fn start_agent<A: Agent>(
        &self,
        key: &str,
        input: &A::Input,
        options: &StartOptions,
    ) -> Result<StartOutcome, ClientError> {
        self.start(A::KIND, key, input, options).await
    }

    /// Everything stored about a run (secrets redacted).
    pub async fn run(&self, run_id: &RunId) -> Result<RunView, ClientError> {
        self.typed(self.get_json(&format!("/runs/{run_id}")).await).await
    }

    /// A run's state.
    pub async fn status(&self, run_id: &RunId) -> Result<Status, ClientError> {
        Ok(self.run(run_id).await?.run.status)
    }

    /// Waits until the run has finished (completed, failed, cancelled or escalated), at most
    /// `timeout`; its final state.
    pub async fn wait(&self, run_id: &RunId, timeout: Duration) -> Result<Status, ClientError> {
        let began = Instant::now();
        loop {
            let status = self.status(run_id).await?;
            if status.is_terminal() {
                return Ok(status);
            }
            if began.elapsed() >= timeout {
                return Err(ClientError::Timeout { run_id: run_id.to_string(), waited: timeout });
            }
            tokio::time::sleep(WAIT_POLL).await;
        }
    }

    /// Waits for the run's output, typed: [`ClientError::NoOutput`] when it ended otherwise.
    pub async fn wait_output<T: DeserializeOwned>(
        &self,
        run_id: &RunId,
        timeout: Duration,
    ) -> Result<T, ClientError> {
        match self.wait(run_id, timeout).await? {
            Status::Completed { output } => {
                serde_json::from_value(output).map_err(|e| ClientError::Decode(e.to_string()))
            }
            other => Err(ClientError::NoOutput {
                run_id: run_id.to_string(),
                state: other.name().to_string(),
                detail: other.detail().to_string(),
            }),
        }
    }

    /// Waits for the output of a run of agent `A`, typed as `A::Output`.
    #[cfg(feature = "agents")]
    pub async fn wait_agent<A: Agent>(
        &self,
        run_id: &RunId,
        timeout: Duration,
    ) -> Result<A::Output, ClientError> {
        self.wait_output(run_id, timeout).await
    }

    /// One page of runs.
    pub async fn list(&self, query: &ListQuery) -> Result<RunPage, ClientError> {
        let mut q = Vec::new();
        if let Some(limit) = query.limit {
            q.push(("limit", limit.to_string()));
        }
        if let Some(below) = query.stash_version_below {
            q.push(("stash_version_below", below.to_string()));
        }
        for (k, v) in [("state", &query.state), ("kind", &query.kind), ("after", &query.after)] {
            if let Some(v) = v {
                q.push((k, v.clone()));
            }
        }
        self.typed(self.get_query("/runs", &q).await).await
    }

    /// Asks a run to stop.
    pub async fn cancel(&self, run_id: &RunId, reason: &str) -> Result<Cancelled, ClientError> {
        self.typed(self.post_json(&format!("/runs/{run_id}/cancel"), &json!({"reason": reason}), None).await)
            .await
    }

    /// Deletes a settled run and every record it owns (an admin token).
    pub async fn delete_run(&self, run_id: &RunId) -> Result<RunDeleted, ClientError> {
        self.typed(self.delete_json(&format!("/runs/{run_id}")).await).await
    }

    /// Sends the external event `name` to a run; a repeated `key` is delivered once.
    pub async fn send_event(
        &self,
        run_id: &RunId,
        name: &str,
        payload: &impl Serialize,
        key: Option<&str>,
    ) -> Result<SendOutcome, ClientError> {
        let payload = serde_json::to_value(payload).map_err(|e| ClientError::Encode(e.to_string()))?;
        let body = json!({"payload": payload, "idempotency_key": key});
        let sent: EventSent =
            self.typed(self.post_json(&format!("/runs/{run_id}/events/{name}"), &body, None).await).await?;
        Ok(sent.outcome)
    }

    /// A message for the run's `on_message`.
    pub async fn message(&self, run_id: &RunId, message: &impl Serialize) -> Result<(), ClientError> {
        let body = serde_json::to_value(message).map_err(|e| ClientError::Encode(e.to_string()))?;
        self.post_json(&format!("/runs/{run_id}/messages"), &body, None).await.map(|_| ())
    }

    /// A request for the run's `on_request`; its reply.
    pub async fn request<T: DeserializeOwned>(
        &self,
        run_id: &RunId,
        request: &impl Serialize,
    ) -> Result<T, ClientError> {
        let body = serde_json::to_value(request).map_err(|e| ClientError::Encode(e.to_string()))?;
        let reply: Reply =
            self.typed(self.post_json(&format!("/runs/{run_id}/requests"), &body, None).await).await?;
        serde_json::from_value(reply.reply).map_err(|e| ClientError::Decode(e.to_string()))
    }

    /// Every pending approval, with the payload and the hash a decision must quote, read a
    /// page of [`PAGE_MAX`] at a time (runs in the order they were started).
    pub async fn approvals(&self) -> Result<Vec<PendingApproval>, ClientError> {
        self.every_page(|last: Option<&PendingApproval>| {
            let after = last.map(PendingApproval::cursor);
            async move { self.approvals_page(after.as_deref(), PAGE_MAX).await }
        })
        .await
    }

    /// One page of the pending approvals: at most `limit` (1 to [`PAGE_MAX`]) after `after`,
    /// the previous page's last one as `<run_id>/<approval_id>`. A page shorter than `limit`
    /// is the last.
    pub async fn approvals_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<PendingApproval>, ClientError> {
        let mut q = vec![("limit", limit.to_string())];
        if let Some(after) = after {
            q.push(("after", after.to_string()));
        }
        self.typed(self.get_query("/approvals", &q).await).await
    }

    /// Decides an approval, quoting the hash of the payload the reviewer saw: a payload that
    /// changed since is [`ApiErrorKind::StaleApproval`](crate::ApiErrorKind::StaleApproval).
    pub async fn decide(
        &self,
        run_id: &RunId,
        approval_id: &str,
        payload_hash: &str,
        approved: bool,
        comment: &str,
    ) -> Result<ApproveOutcome, ClientError> {
        let body = json!({"payload_hash": payload_hash, "approved": approved, "comment": comment});
        self.typed(self.post_json(&format!("/runs/{run_id}/approvals/{approval_id}"), &body, None).await)
            .await
    }

    /// A run's pending alarms, read a page of [`PAGE_MAX`] at a time.
    pub async fn alarms(&self, run_id: &RunId) -> Result<Vec<Alarm>, ClientError> {
        let path = format!("/runs/{run_id}/alarms");
        self.every_page(|last: Option<&Alarm>| {
            let mut q = vec![("limit", PAGE_MAX.to_string())];
            q.extend(last.map(|a| ("after", a.name.clone())));
            let path = &path;
            async move { self.typed(self.get_query(path, &q).await).await }
        })
        .await
    }

    /// Every item of a list read page by page: `page` reads the page after the last item so
    /// far (the first when there is none), and a page shorter than [`PAGE_MAX`] is the last.
    async fn every_page<T, F, Fut>(&self, page: F) -> Result<Vec<T>, ClientError>
    where
        F: Fn(Option<&T>) -> Fut,
        Fut: std::future::Future<Output = Result<Vec<T>, ClientError>>,
    {
        let mut all: Vec<T> = Vec::new();
        loop {
            let next = page(all.last()).await?;
            let last = next.len() < PAGE_MAX;
            all.extend(next);
            if last {
                return Ok(all);
            }
        }
    }

    /// One page of a run's storage: keys under `prefix`, after `start_after`.
    pub async fn storage(
        &self,
        run_id: &RunId,
        prefix: &str,
        start_after: Option<&str>,
        limit: Option<usize>,
    ) -> Result<StoragePage, ClientError> {
        let mut q = vec![("prefix", prefix.to_string())];
        if let Some(after) = start_after {
            q.push(("start_after", after.to_string()));
        }
        if let Some(limit) = limit {
            q.push(("limit", limit.to_string()));
        }
        self.typed(self.get_query(&format!("/runs/{run_id}/storage"), &q).await).await
    }

    /// The run's output stream from chunk `from`, as it is written: the chunks already
    /// durable, then each new one, until the run ends, with a streaming effect's partial
    /// chunks and resets between them (see `Runtime::stream`). A dropped connection is
    /// reopened with `Last-Event-ID`, so no durable chunk is missed or repeated; partial
    /// chunks shown before the drop are taken back with a reset.
    pub fn stream(
        &self,
        run_id: &RunId,
        from: u64,
    ) -> impl Stream<Item = Result<StreamItem, ClientError>> + Send + 'static {
        sse::follow(self.clone(), format!("/runs/{run_id}/stream"), from)
    }

    /// Creates an API token (admin); its secret is in the answer, and only there.
    pub async fn tokens_create(&self, name: &str, role: &str) -> Result<TokenCreated, ClientError> {
        self.typed(self.post_json("/tokens", &json!({"name": name, "role": role}), None).await).await
    }

    /// Every token's name, role and creation time (admin).
    pub async fn tokens_list(&self) -> Result<Vec<TokenShown>, ClientError> {
        self.typed(self.get_json("/tokens").await).await
    }

    /// Revokes a token at once (admin).
    pub async fn tokens_revoke(&self, name: &str) -> Result<TokenRevoked, ClientError> {
        self.typed(self.delete_json(&format!("/tokens/{name}")).await).await
    }
}
