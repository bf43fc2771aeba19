//! What a hook does through its `Ctx`: stash and stream, storage, effects, approvals,
//! alarms, keep-alive, cancellation, budget charges and secrets.

use durafiber_api::Timestamp;
use durafiber_store::RunId;
use std::{future::Future, marker::PhantomData};

use durafiber_store::{
    Batch, Durability,
    tables::{self, Decision, StashRecord},
};
use serde::{Serialize, de::DeserializeOwned};

use super::{Agent, Ctx};
use crate::{
    alarm::{self, AlarmSpec},
    approval,
    approval_quorum::ApprovalRule,
    boundary::Boundary,
    budget,
    clock::Stopwatch,
    config::DurabilityMode,
    effect::{self, EffectError, EffectOptions},
    effect_ledger,
    effect_stream::{StreamSink, StreamedEffect},
    error::AgentError,
    eviction::keep_alive::KeepAlive,
    json,
    kernel::{
        commit::{self, After},
        shared::RawCtx,
        stash_record::Stored,
    },
    stash,
    storage::Storage,
    stream,
};

impl<A: Agent> Ctx<A> {
    pub(crate) fn new(raw: RawCtx) -> Self {
        Ctx { raw, _agent: PhantomData }
    }

    /// The run's id, the same before and after every crash.
    pub fn run_id(&self) -> &RunId {
        &self.raw.cell.run_id
    }

    /// This fiber attempt's number, from 1 (0 in `on_alarm` and `on_message`).
    pub fn attempt(&self) -> u32 {
        self.raw.attempt
    }

    /// The runtime clock's time.
    pub fn now(&self) -> Timestamp {
        self.raw.shared.now()
    }

    /// Persists the run's snapshot at a named step, replacing the last one. In `sync`
    /// durability it returns once the stash is on disk.
    /// Only the fiber stashes: a handler gets [`AgentError::StashFromHandler`] and writes
    /// [`Ctx::storage`] instead.
    pub async fn stash(&mut self, step: &str, value: &A::Stash) -> Result<(), AgentError> {
        if !self.raw.in_fiber {
            return Err(AgentError::StashFromHandler);
        }
        self.raw.refuse_if_cancelled("stash")?;
        let text = json::canonical(value).map_err(|e| AgentError::Serialization(e.into()))?;
        budget::check(&self.raw)?;
        // Boxed, as every durable call here is: its state lives while it runs, not in the
        // agent's future for the whole of the fiber's life.
        Box::pin(write_stash(&self.raw, step, text, A::STASH_VERSION)).await
    }

    /// Appends `chunk` to the run's durable output stream (model tokens, progress lines) and
    /// returns its sequence number. It becomes durable with the run's next boundary — a
    /// stash, an effect, a wait, the fiber's end — in the same write. Readers
    /// (`Runtime::stream`, `GET /runs/{id}/stream`) see only durable chunks, so nothing they
    /// were shown is ever taken back.
    ///
    /// **The stream is exactly what an uninterrupted run would emit.** Each stash records the
    /// fiber's place in the stream. A fiber re-entered at its last stash (after a crash, an
    /// eviction, a wait) stands at that place again: a chunk it emits where the stream already
    /// holds one is matched with it — not stored, not shown again, its sequence number
    /// returned — and the first chunk past the stream's end continues it. So write the fiber
    /// plainly, with no guard against repeats. A re-entered fiber that emits a *different*
    /// chunk at a place the stream holds (a deploy reworded it) keeps the durable chunk — a
    /// reader may have seen it — and the difference is recorded: an event in the run's
    /// timeline, `durafiber_stream_reemissions_total`, and the run's inspection
    /// (`reemissions`). Under `RuntimeConfig::strict_streams`, which `AgentCheck` runs with,
    /// it is [`AgentError::StreamDiverged`] and the run escalates: within one build a
    /// different re-emission is a determinism bug. Past `stream_bytes_max` it is
    /// [`AgentError::StreamFull`]. Fiber only.
    ///
    /// ```no_run
    /// # use durafiber_runtime::{Agent, AgentError, Ctx, Recovered};
    /// struct Writer;
    /// impl Agent for Writer {
    ///     const KIND: &'static str = "writer";
    ///     type Input = u32;
    ///     type Stash = u32;
    ///     type Output = ();
    ///     type Message = ();
    ///     async fn run_fiber(&self, ctx: &mut Ctx<Self>, lines: u32) -> Result<(), AgentError> {
    ///         write_from(ctx, 0, lines).await
    ///     }
    ///     async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, r: Recovered<Self>) -> Result<(), AgentError> {
    ///         write_from(ctx, r.stash.unwrap_or(0), r.input).await
    ///     }
    /// }
    /// async fn write_from(ctx: &mut Ctx<Writer>, from: u32, lines: u32) -> Result<(), AgentError> {
    ///     for line in from..lines {
    ///         ctx.emit(&format!("line {line}"))?;
    ///         ctx.stash("line", &(line + 1)).await?; // the line and the progress, in one write
    ///     }
    ///     Ok(())
    /// }
    /// ```
    pub fn emit<T: Serialize + ?Sized>(&self, chunk: &T) -> Result<u64, AgentError> {
        stream::emit(&self.raw, chunk)
    }

    /// [`Ctx::emit`], durable before it returns: one commit per chunk (group commit shares
    /// the barrier among runs). A crash then loses no chunk, and a fiber re-entered at its
    /// last stash emits again as [`Ctx::emit`] says: what the stream holds is matched, not
    /// repeated.
    pub async fn emit_sync<T: Serialize + ?Sized>(&mut self, chunk: &T) -> Result<u64, AgentError> {
        self.raw.refuse_if_cancelled("emit_sync")?;
        Box::pin(stream::emit_sync(&self.raw, chunk)).await
    }

    /// The sequence number the fiber's next chunk gets: its place in the output stream. After
    /// a re-entry, the place recorded with the stash it re-entered, which may be behind the
    /// stream's end while the fiber emits again what the stream holds (see [`Ctx::emit`]).
    pub fn stream_len(&self) -> Result<u64, AgentError> {
        stream::next_seq(&self.raw)
    }

    /// The run's last durable stash, with its step and sequence number; `None` before the
    /// first. Readable from the fiber and from handlers (`on_alarm`, `on_message`): the fiber
    /// owns the stash, a handler reads what it last committed.
    /// A stash of an older [`Agent::STASH_VERSION`] is upgraded as recovery upgrades it.
    pub fn last_stash(&self) -> Result<Option<(A::Stash, String, u64)>, AgentError> {
        let Some(stored) = stash::read(&self.raw.shared.store, &self.raw.cell.run_id)? else {
            return Ok(None);
        };
        let stash = stash::decode_versioned(&stored, A::STASH_VERSION, A::upgrade_stash)?;
        Ok(Some((stash, stored.record.step, stored.record.seq)))
    }

    /// The run's own key-value storage, in the fiber and in handlers alike; see [`Storage`].
    /// A write is durable by the run's next boundary, or at `storage().sync()` — possibly before
    /// it, so it is not part of the next stash (see [`Storage`]).
    pub fn storage(&self) -> Storage<'_> {
        Storage::new(&self.raw.shared, &self.raw.cell)
    }

    /// Performs one side effect exactly once per `(run, effect_id)` (§5). `f` gets the
    /// idempotency key, minted once and persisted before the first call, and the arguments.
    /// A committed effect returns its stored receipt without calling `f`.
    pub async fn effect<Args, R, F, Fut, E>(
        &mut self,
        effect_id: &str,
        args: Args,
        f: F,
    ) -> Result<R, AgentError>
    where
        Args: Serialize + Clone + Send,
        R: Serialize + DeserializeOwned + Send,
        F: FnMut(String, Args) -> Fut + Send,
        Fut: Future<Output = Result<R, E>> + Send,
        E: std::fmt::Display,
    {
        self.raw.refuse_if_cancelled(&format!("effect {effect_id}"))?;
        let mut f = f;
        let call = move |key, args| {
            let answer = f(key, args);
            async move { answer.await.map_err(|e| EffectError::Retryable(e.to_string())) }
        };
        Box::pin(effect::perform(
            &mut self.raw,
            effect_id,
            args,
            EffectOptions::default(),
            &effect_ledger::Plain,
            call,
        ))
        .await
    }

    /// [`Ctx::effect`] with its own retry policy, and errors that say whether to retry:
    /// `f` answers [`EffectError::Permanent`] for a refusal (it reaches the fiber at once as
    /// [`AgentError::EffectRejected`]) and [`EffectError::Retryable`] for the rest (tried
    /// again per `options`, then [`AgentError::EffectFailed`]). `?` on any error is retryable.
    ///
    /// What a fiber does with an effect that failed is its choice, made in code:
    /// - return the error: a rejected effect fails the run; an exhausted one re-enters the run
    ///   through recovery, like an interruption, with the same key (counted against
    ///   `max_recover_attempts`, then escalated);
    /// - `AgentError::escalate(..)`: a human looks at once;
    /// - park and try later: `ctx.sleep_for("retry-charge", Duration::from_secs(600))`, then
    ///   call the effect again; its key is the same, its attempts start over.
    ///
    /// ```no_run
    /// # use durafiber_runtime::{Agent, AgentError, Ctx, EffectError, EffectOptions};
    /// # use std::time::Duration;
    /// # async fn post(key: &str, cents: u64) -> std::io::Result<(u16, String)> { Ok((200, String::new())) }
    /// # async fn charge<A: Agent>(ctx: &mut Ctx<A>) -> Result<String, AgentError> {
    /// let policy = EffectOptions { attempts: 5, timeout: Some(Duration::from_secs(10)), ..Default::default() };
    /// ctx.effect_with("charge", 1250u64, policy, |key, cents| async move {
    ///     let (status, body) = post(&key, cents).await?; // an I/O error: retryable
    ///     if status >= 400 {
    ///         return Err(EffectError::from_status(status, body)); // a 4xx: permanent
    ///     }
    ///     Ok(body)
    /// })
    /// .await
    /// # }
    /// ```
    pub async fn effect_with<Args, R, F, Fut>(
        &mut self,
        effect_id: &str,
        args: Args,
        options: EffectOptions,
        f: F,
    ) -> Result<R, AgentError>
    where
        Args: Serialize + Clone + Send,
        R: Serialize + DeserializeOwned + Send,
        F: FnMut(String, Args) -> Fut + Send,
        Fut: Future<Output = Result<R, EffectError>> + Send,
    {
        self.raw.refuse_if_cancelled(&format!("effect {effect_id}"))?;
        Box::pin(effect::perform(&mut self.raw, effect_id, args, options, &effect_ledger::Plain, f)).await
    }

    /// [`Ctx::effect_with`] for a call that streams its answer — a model's tokens. `f` gets
    /// the idempotency key, the arguments and a [`StreamSink`]; each chunk it sends is shown at
    /// once to the run's readers (`Runtime::stream`, `GET /runs/{id}/stream`) as a partial
    /// chunk. The call that succeeds has its chunks written to the run's output stream with
    /// the effect's receipt, in one write: the stream then holds one complete copy of the
    /// answer. A call that fails, times out or is cut off has its chunks taken back — readers
    /// see a reset, then the next call from its start, with the same key. Committed, the
    /// effect is never called again: a re-entered fiber gets the stored answer, and its chunks
    /// are matched with the stream as [`Ctx::emit`] matches, so a model answer is paid for
    /// once. Fiber only.
    ///
    /// ```no_run
    /// # use durafiber_runtime::{Agent, AgentError, Ctx, EffectError, EffectOptions};
    /// # async fn tokens(prompt: &str) -> Vec<String> { vec![] }
    /// # async fn answer<A: Agent>(ctx: &mut Ctx<A>) -> Result<String, AgentError> {
    /// ctx.effect_stream("answer", "Why is the sky blue?".to_string(), EffectOptions::default(), |key, prompt, sink| async move {
    ///     let mut answer = String::new();
    ///     for token in tokens(&prompt).await { // a real client streams with `key` as its idempotency key
    ///         sink.send(&token)?;
    ///         answer.push_str(&token);
    ///     }
    ///     Ok(answer)
    /// })
    /// .await
    /// # }
    /// ```
    pub async fn effect_stream<Args, R, F, Fut>(
        &mut self,
        effect_id: &str,
        args: Args,
        options: EffectOptions,
        mut f: F,
    ) -> Result<R, AgentError>
    where
        Args: Serialize + Clone + Send,
        R: Serialize + DeserializeOwned + Send,
        F: FnMut(String, Args, StreamSink) -> Fut + Send,
        Fut: Future<Output = Result<R, EffectError>> + Send,
    {
        if !self.raw.in_fiber {
            return Err(AgentError::EmitFromHandler);
        }
        self.raw.refuse_if_cancelled(&format!("effect {effect_id}"))?;
        let streamed = StreamedEffect::new(&self.raw, effect_id)?;
        let calls = streamed.clone();
        let call = move |key, args| {
            let (sink, guard) = calls.begin_call();
            let answer = f(key, args, sink);
            async move {
                match answer.await {
                    Ok(result) => Ok(guard.succeeded(result)),
                    Err(e) => {
                        guard.failed(&e);
                        Err(e)
                    }
                }
            }
        };
        let performed =
            Box::pin(effect::perform(&mut self.raw, effect_id, args, options, &*streamed, call)).await;
        streamed.ended(performed)
    }

    /// Pauses for a human (§6): writes the pause bound to the payload's hash, then waits.
    /// Re-entered after a crash with the same payload, it returns the recorded decision.
    pub async fn request_approval<P: Serialize>(
        &mut self,
        approval_id: &str,
        payload: &P,
    ) -> Result<Decision, AgentError> {
        self.request(approval_id, payload, None).await
    }

    /// `request_approval` decided by more than one person: the pause is decided once `rule`
    /// is met — `required` approvals by different people it allows, or the declines it says
    /// — each decision recorded with who made it and the hash they quoted. Re-entered after
    /// a crash, it returns the recorded decision, as `request_approval` does.
    ///
    /// ```no_run
    /// # use durafiber_runtime::{Agent, AgentError, ApprovalRule, Ctx, Reviewers};
    /// # async fn refund<A: Agent>(ctx: &mut Ctx<A>) -> Result<(), AgentError> {
    /// let rule = ApprovalRule::of(2).from(Reviewers::Named(vec!["alice".into(), "bob".into(), "carol".into()]));
    /// let decision = ctx.request_approval_with("refund", &serde_json::json!({"cents": 250_000}), &rule).await?;
    /// # let _ = decision; Ok(()) }
    /// ```
    pub async fn request_approval_with<P: Serialize>(
        &mut self,
        approval_id: &str,
        payload: &P,
        rule: &ApprovalRule,
    ) -> Result<Decision, AgentError> {
        self.request(approval_id, payload, Some(rule)).await
    }

    /// A pause for a human, with its rule if it has one.
    async fn request<P: Serialize>(
        &mut self,
        approval_id: &str,
        payload: &P,
        rule: Option<&ApprovalRule>,
    ) -> Result<Decision, AgentError> {
        self.raw.refuse_if_cancelled(&format!("approval {approval_id}"))?;
        // What a reviewer is shown never holds a secret value.
        let (payload_json, payload_hash) = self
            .raw
            .shared
            .obs
            .redacted_with_hash(payload)
            .map_err(|e| AgentError::Serialization(e.into()))?;
        budget::check(&self.raw)?;
        Box::pin(approval::request(&mut self.raw, approval_id, payload_json, payload_hash, rule)).await
    }

    /// Sets (or replaces) the run's alarm called `name`.
    pub async fn set_alarm(&self, name: &str, spec: AlarmSpec) -> Result<(), AgentError> {
        let raw = &self.raw;
        alarm::set(&raw.shared, &raw.cell.run_id, name, spec, None, Some(&raw.cell))
            .await
            .map_err(AgentError::from)
    }

    /// Cancels the run's alarm called `name`; true when there was one.
    pub async fn cancel_alarm(&self, name: &str) -> Result<bool, AgentError> {
        alarm::cancel(&self.raw.shared, &self.raw.cell.run_id, name).await.map_err(AgentError::from)
    }

    /// The run's pending alarms, by name, each with its next due time, its cron schedule and
    /// its failed occurrences being retried. The runtime's own (an approval's escalation, a
    /// durable sleep's wake, an event wait's timeout) are among them, marked by
    /// `AlarmRecord::system`; only the others are the agent's to cancel.
    pub fn alarms(&self) -> Result<Vec<alarm::Alarm>, AgentError> {
        alarm::list(&self.raw.shared, &self.raw.cell.run_id).map_err(AgentError::from)
    }

    /// Keeps the run from hibernation and eviction while the guard lives.
    pub fn keep_alive(&self) -> KeepAlive {
        KeepAlive::acquire(self.raw.shared.clone(), &self.raw.cell.run_id)
    }

    /// Runs `fut` holding a keep-alive.
    pub async fn keep_alive_while<F: Future>(&self, fut: F) -> F::Output {
        let _guard = self.keep_alive();
        fut.await
    }

    /// Whether the run was asked to stop.
    pub fn is_cancelled(&self) -> bool {
        self.raw.cell.cancel.is_requested()
    }

    /// Completes when the run is asked to stop.
    pub async fn cancelled(&self) {
        if self.raw.in_fiber {
            // A fiber that waits here has nothing more to do: its recovery has settled.
            self.raw.shared.settle_hook(&self.raw.cell).await;
        }
        self.raw.shared.life.parked(self.raw.in_fiber, self.raw.cell.cancel.requested()).await;
    }

    /// Records `units` of cost (model tokens, API credits — whatever the run's budget counts)
    /// spent on `what`. Durable with the run's next boundary; once the run's charges pass its
    /// `cost_units_max`, it stops at that boundary with `Escalated{reason: "budget:
    /// cost_units"}` and starts no new effect.
    ///
    /// ```no_run
    /// # use durafiber_runtime::{Agent, AgentError, Ctx};
    /// # struct Researcher;
    /// # impl Agent for Researcher {
    /// #     const KIND: &'static str = "researcher";
    /// #     type Input = ();
    /// #     type Stash = u32;
    /// #     type Output = ();
    /// #     type Message = ();
    /// async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<(), AgentError> {
    ///     for turn in 1.. {
    ///         let tokens_used = 1_200; // what the model call reported
    ///         ctx.charge(tokens_used, "model turn");
    ///         ctx.stash("turn", &turn).await?; // stops here once the budget is spent
    ///     }
    ///     Ok(())
    /// }
    /// # }
    /// ```
    pub fn charge(&self, units: u64, what: &str) {
        budget::charge(&self.raw, units, what);
    }
}

/// A stash written: its record, version and stream mark staged in one batch (and in the
/// run's history), committed as the run's durability mode says, the actions after it run by
/// the committer. In `exit` mode it waits in the cell for the fiber to end or wait.
async fn write_stash(raw: &RawCtx, step: &str, stash_json: String, version: u32) -> Result<(), AgentError> {
    let shared = &raw.shared;
    let stash_json = shared.obs.redact(stash_json);
    let max = shared.config.stash_bytes_max;
    if stash_json.len() > max {
        return Err(AgentError::StashTooLarge { bytes: stash_json.len(), max });
    }
    tables::check_id("step", step).map_err(AgentError::fail)?;
    let record = StashRecord {
        run_id: raw.cell.run_id.clone(),
        attempt: raw.attempt,
        step: step.to_string(),
        seq: shared.next_seq(&raw.cell),
        stash_json,
        written_at_ms: shared.now(),
    };
    let stream_mark = stream::new_mark(raw);
    let stored = Stored { record, version, stream_mark };
    let durability = match raw.cell.durability {
        // The mark goes with the stash when it is written; the buffer keeps the stored one.
        DurabilityMode::Exit => {
            *raw.cell.pending_exit.lock() = Some(Box::new(stored));
            return Ok(());
        }
        DurabilityMode::Sync => Durability::Sync,
        DurabilityMode::Async => Durability::Async,
    };
    let watch = Stopwatch::start();
    let mut batch = Batch::new();
    stored.stage(&mut batch, shared.config.history_max)?;
    let record = &stored.record;
    let after = After::at((Boundary::AfterStash, step))
        .stream_mark(stream_mark)
        .latency(|m| &m.stash_commit, watch)
        .event("stashed", format!("step {step}, seq {}", record.seq))
        .span(shared, || {
            raw.span_since("stash", record.written_at_ms)
                .attr("durafiber.stash.step", step.to_string())
                .attr("durafiber.stash.seq", i64::try_from(record.seq).unwrap_or(i64::MAX))
                .attr("durafiber.stash.bytes", i64::try_from(record.stash_json.len()).unwrap_or(i64::MAX))
        });
    commit::commit(raw, batch, durability, after).await?;
    Ok(())
}
