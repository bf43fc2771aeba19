//! Durable output streams on the crash-simulating store: a reader gets every chunk once and in
//! order, from any sequence number, and never a chunk a crash takes back; a run crashed at
//! every barrier finishes with a stream that has no gap and no repeat; `emit_sync` does the
//! same for a fiber that makes each chunk durable at once; a fiber re-entered at its last
//! stash after a wait or an eviction repeats no chunk, and one that emits something else (a
//! deploy reworded it) keeps the durable chunk and records the new one — escalated only under
//! `strict_streams`, as the checker runs; the limit and the handler rule are typed errors.

use durafiber_runtime::Timestamp;
use std::{sync::Arc, time::Duration};

use durafiber_demo::agents::{Writer, WriterInput};
use durafiber_runtime::{
    Agent, AgentError, Ctx, Recovered, RunStatus, Runtime, RuntimeConfig, StreamChunk, StreamItem,
    clock::VirtualClock,
};
use durafiber_store::{RunId, SimBackend, SimCrash, Store, StoreConfig};
use futures::StreamExt;

fn store(sim: &SimBackend) -> Store {
    Store::with_backend(Arc::new(sim.clone()), StoreConfig::default()).expect("store")
}

async fn open<A: Agent>(sim: &SimBackend, agent: A) -> Runtime {
    Runtime::builder(store(sim)).agent(agent).open().await.expect("runtime")
}

fn tokens(from: u32, to: u32) -> Vec<(u64, String)> {
    (from..to).map(|n| (u64::from(n), format!("token {n}"))).collect()
}

fn transcript(chunks: &[StreamChunk]) -> Vec<(u64, String)> {
    // A chunk says what it is; `token n` chunks are checked against their place.
    chunks.iter().map(|c| (c.seq, c.data::<String>().expect("a string chunk"))).collect()
}

async fn read_all(rt: &Runtime, run_id: &RunId, from: u64) -> Vec<StreamChunk> {
    let stream = rt.stream(run_id, from).expect("stream");
    let read = stream.map(|c| c.expect("chunk").durable().expect("a durable chunk")).collect::<Vec<_>>();
    tokio::time::timeout(Duration::from_secs(60), read).await.expect("the stream ends with its run")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_gets_every_chunk_once_in_order_from_any_point() {
    let sim = SimBackend::new();
    let rt = open(&sim, Writer).await;
    let input = WriterInput { chunks: 100, per_stash: 10, pause_ms: 0 };
    // A reader that attaches before the run starts follows it to its end.
    let run_id = rt.start::<Writer>("w", &input).await.expect("start").run_id;
    let early = tokio::spawn({
        let stream = rt.stream(&run_id, 0).expect("stream");
        async move {
            stream.map(|c| c.expect("chunk").durable().expect("a durable chunk")).collect::<Vec<_>>().await
        }
    });
    assert!(matches!(rt.wait(&run_id).await.expect("wait"), RunStatus::Completed { .. }));
    let early = tokio::time::timeout(Duration::from_secs(60), early).await.expect("ends").expect("reader");
    assert_eq!(transcript(&early), tokens(0, 100));
    assert_eq!(transcript(&read_all(&rt, &run_id, 0).await), tokens(0, 100));
    assert_eq!(transcript(&read_all(&rt, &run_id, 57).await), tokens(57, 100), "resumed after chunk 56");
    assert!(read_all(&rt, &run_id, 100).await.is_empty());
    assert_eq!(rt.stream_chunks(&run_id, 98, 10).expect("page").len(), 2);
    assert!(rt.stream(&"run_nope".into(), 0).is_err(), "an unknown run is refused, not an empty stream");
    rt.shutdown().await;
}

/// Crashes the store at `point` while a writer streams with a reader attached; then the run
/// finishes in a new process. Returns what the reader saw before the crash, the final stream,
/// and whether the crash happened at all.
async fn crash_at(point: SimCrash) -> (Vec<(u64, String)>, Vec<(u64, String)>, bool) {
    let sim = SimBackend::new();
    let mut crashed = sim.crashed_signal();
    sim.crash_at(point);
    let input = WriterInput { chunks: 30, per_stash: 4, pause_ms: 0 };
    let rt = open(&sim, Writer).await;
    let mut before = Vec::new();
    let mut run_id = None;
    if let Ok(started) = rt.start::<Writer>("w", &input).await {
        run_id = Some(started.run_id.clone());
        if let Ok(mut stream) = rt.stream(&started.run_id, 0) {
            loop {
                tokio::select! {
                    chunk = stream.next() => match chunk {
                        Some(Ok(c)) => before.extend(c.durable()),
                        Some(Err(_)) | None => break,
                    },
                    _ = crashed.wait_for(|c| *c) => break,
                }
            }
        }
    }
    rt.shutdown().await;
    let did_crash = sim.is_crashed();
    sim.revive();
    let rt = open(&sim, Writer).await;
    // A start with the same key finds the run the crash left, or mints it if it was lost.
    let run_id = match run_id {
        Some(id) if rt.status(&id).is_ok() => id,
        _ => rt.start::<Writer>("w", &input).await.expect("start again").run_id,
    };
    let status = tokio::time::timeout(Duration::from_secs(60), rt.wait(&run_id)).await.expect("finishes");
    assert!(matches!(status, Ok(RunStatus::Completed { .. })), "{point:?}: {status:?}");
    let after = transcript(&read_all(&rt, &run_id, 0).await);
    rt.shutdown().await;
    (transcript(&before), after, did_crash)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_at_every_write_leaves_a_stream_without_gap_or_repeat() {
    let mut crashes = 0;
    for n in 1..=30 {
        // After a write and before its barrier (it is lost), and after a barrier (it is kept).
        for point in [SimCrash::AfterApply(n), SimCrash::AfterBarrier(n)] {
            let (before, after, crashed) = crash_at(point).await;
            crashes += usize::from(crashed);
            assert_eq!(after, tokens(0, 30), "{point:?}: the finished stream");
            assert!(
                before.len() <= after.len() && before[..] == after[..before.len()],
                "{point:?}: a reader saw a chunk the crash took back: {before:?}"
            );
        }
    }
    assert!(crashes >= 20, "only {crashes} crash points were reached");
}

/// One chunk per stash, each naming the fiber attempt that wrote it: a chunk lost in a crash
/// and written again differs from the one before.
struct AttemptWriter;

impl AttemptWriter {
    async fn write(&self, ctx: &mut Ctx<Self>, chunks: u32, from: u32) -> Result<u32, AgentError> {
        for n in from..chunks {
            ctx.sleep_in_memory(Duration::from_millis(5)).await;
            ctx.emit(&format!("token {n} attempt {}", ctx.attempt()))?;
            ctx.stash("written", &(n + 1)).await?;
        }
        Ok(chunks)
    }
}

impl Agent for AttemptWriter {
    const KIND: &'static str = "attempt_writer";
    type Input = u32;
    type Stash = u32;
    type Output = u32;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, chunks: u32) -> Result<u32, AgentError> {
        self.write(ctx, chunks, 0).await
    }

    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, r: Recovered<Self>) -> Result<u32, AgentError> {
        self.write(ctx, r.input, r.stash.unwrap_or(0)).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_comes_while_a_write_is_not_durable_never_sees_it() {
    let sim = SimBackend::new();
    let rt = open(&sim, AttemptWriter).await;
    let run_id = rt.start::<AttemptWriter>("a", &40).await.expect("start").run_id;
    let mut first = rt.stream(&run_id, 0).expect("stream");
    for _ in 0..5 {
        first.next().await.expect("a chunk").expect("chunk").durable().expect("a durable chunk");
    }
    // The next boundary is written but its barrier does not return: a reader that comes now
    // could see it, and the crash below takes it back.
    sim.stall_barriers(true);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut late = rt.stream(&run_id, 0).expect("stream");
    let mut seen = Vec::new();
    while let Ok(Some(Ok(StreamItem::Chunk(chunk)))) =
        tokio::time::timeout(Duration::from_millis(200), late.next()).await
    {
        seen.push(chunk);
    }
    sim.crash();
    sim.stall_barriers(false);
    rt.shutdown().await;
    sim.revive();
    let rt = open(&sim, AttemptWriter).await;
    let status = tokio::time::timeout(Duration::from_secs(60), rt.wait(&run_id)).await.expect("finishes");
    assert!(matches!(status, Ok(RunStatus::Completed { .. })), "{status:?}");
    let after = read_all(&rt, &run_id, 0).await;
    assert_eq!(after.len(), 40);
    // It may have read nothing: a read waits for the write it could see to be durable.
    assert_eq!(
        transcript(&seen)[..],
        transcript(&after)[..seen.len()],
        "a chunk the crash took back was shown"
    );
    assert!(after.last().and_then(|c| c.data::<String>().ok()).is_some_and(|t| !t.ends_with("attempt 1")));
    rt.shutdown().await;
}

/// Makes every chunk durable as it goes, and never stashes: re-entered, it emits everything
/// again from the top, which the stream takes as what it holds. Asked for no chunk, it waits
/// to be cancelled, so that a test can send it messages.
struct SyncWriter;

impl SyncWriter {
    async fn write(&self, ctx: &mut Ctx<Self>, chunks: u32) -> Result<u32, AgentError> {
        if chunks == 0 {
            ctx.cancelled().await;
        }
        for n in 0..chunks {
            ctx.emit_sync(&format!("token {n}")).await?;
        }
        Ok(chunks)
    }
}

impl Agent for SyncWriter {
    const KIND: &'static str = "sync_writer";
    type Input = u32;
    type Stash = ();
    type Output = u32;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, chunks: u32) -> Result<u32, AgentError> {
        self.write(ctx, chunks).await
    }

    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, r: Recovered<Self>) -> Result<u32, AgentError> {
        self.write(ctx, r.input).await
    }

    async fn on_message(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<(), AgentError> {
        match ctx.emit(&"from a handler") {
            Err(AgentError::EmitFromHandler) => Ok(()),
            other => Err(AgentError::fail(format!("a handler emitted: {other:?}"))),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emit_sync_survives_a_crash_at_every_barrier_without_a_guard() {
    for n in 1..=25 {
        let sim = SimBackend::new();
        let mut crashed = sim.crashed_signal();
        sim.crash_at(SimCrash::AfterBarrier(n));
        let rt = open(&sim, SyncWriter).await;
        if let Ok(out) = rt.start::<SyncWriter>("s", &20).await {
            tokio::select! {
                _ = rt.wait(&out.run_id) => {}
                _ = crashed.wait_for(|c| *c) => {}
            }
        }
        rt.shutdown().await;
        sim.revive();
        let rt = open(&sim, SyncWriter).await;
        let run_id = rt.start::<SyncWriter>("s", &20).await.expect("start").run_id;
        let status = tokio::time::timeout(Duration::from_secs(60), rt.wait(&run_id)).await.expect("finishes");
        assert!(matches!(status, Ok(RunStatus::Completed { .. })), "barrier {n}: {status:?}");
        assert_eq!(transcript(&read_all(&rt, &run_id, 0).await), tokens(0, 20), "barrier {n}");
        rt.shutdown().await;
    }
}

/// Emits chunks of 1 KiB until the stream is full, then reports the error.
struct Flood;

impl Agent for Flood {
    const KIND: &'static str = "flood";
    type Input = ();
    type Stash = ();
    type Output = String;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<String, AgentError> {
        let chunk = "x".repeat(1024);
        loop {
            match ctx.emit(&chunk) {
                Ok(_) => {}
                Err(e @ AgentError::StreamFull { .. }) => return Ok(e.to_string()),
                Err(e) => return Err(e),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_stream_is_a_typed_error_and_a_handler_cannot_emit() {
    let config = RuntimeConfig { stream_bytes_max: 10 * 1024, ..RuntimeConfig::default() };
    let rt = Runtime::builder(store(&SimBackend::new()))
        .config(config)
        .agent(Flood)
        .agent(SyncWriter)
        .open()
        .await;
    let rt = rt.expect("runtime");
    let run_id = rt.start::<Flood>("f", &()).await.expect("start").run_id;
    rt.wait(&run_id).await.expect("wait");
    let message: String = rt.output(&run_id).expect("output").expect("completed");
    assert!(message.contains("would pass the limit of 10240 bytes"), "{message}");
    // Nine chunks of 1,026 bytes (quotes included) fit; the tenth would not.
    assert_eq!(rt.stream_chunks(&run_id, 0, 100).expect("chunks").len(), 9);

    let run_id = rt.start::<SyncWriter>("s", &0).await.expect("start").run_id;
    rt.send::<SyncWriter>(&run_id, &()).await.expect("the handler found emit refused");
    rt.shutdown().await;
}

/// The contract's minimal case: emit `a`, stash, emit `b`, sleep durably, emit `c`, stash.
/// Re-entered at its stash after the sleep, it emits `b` again, as the code says. With
/// `diverge`, its re-entry emits `B` instead.
struct Sleeper {
    diverge: bool,
}

impl Sleeper {
    async fn after_a(&self, ctx: &mut Ctx<Self>, reentered: bool) -> Result<u32, AgentError> {
        ctx.emit(if self.diverge && reentered { "B" } else { "b" })?;
        ctx.sleep_for("nap", Duration::from_secs(60)).await?;
        ctx.emit("c")?;
        ctx.stash("c", &2).await?;
        Ok(3)
    }
}

impl Agent for Sleeper {
    const KIND: &'static str = "sleeper";
    type Input = ();
    type Stash = u32;
    type Output = u32;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<u32, AgentError> {
        ctx.emit("a")?;
        ctx.stash("a", &1).await?;
        self.after_a(ctx, false).await
    }

    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, r: Recovered<Self>) -> Result<u32, AgentError> {
        match r.stash {
            Some(1) => self.after_a(ctx, true).await,
            other => Err(AgentError::fail(format!("re-entered at {other:?}"))),
        }
    }
}

/// Runs a [`Sleeper`] to its end with an eviction during the sleep or a crash of the process;
/// returns its status and stream.
async fn sleep_through(diverge: bool, crash: bool) -> (RunStatus, Vec<String>) {
    let (status, stream, _) = sleep_through_with(diverge, crash, RuntimeConfig::default()).await;
    (status, stream)
}

/// [`sleep_through`] with `config`; also what inspection says of re-emitted chunks, and the
/// counter of them.
async fn sleep_through_with(
    diverge: bool,
    crash: bool,
    config: RuntimeConfig,
) -> (RunStatus, Vec<String>, (serde_json::Value, u64)) {
    let (sim, clock) = (SimBackend::new(), VirtualClock::new(Timestamp::from_millis(1_000_000_000)));
    let open = || async {
        Runtime::builder(store(&sim))
            .config(config.clone())
            .virtual_clock(clock.clone())
            .agent(Sleeper { diverge })
            .open()
            .await
            .expect("runtime")
    };
    let mut rt = open().await;
    let run_id = rt.start::<Sleeper>("s", &()).await.expect("start").run_id;
    rt.advance(Duration::from_secs(1)).await.expect("advance");
    assert_eq!(rt.status(&run_id).expect("status"), RunStatus::WaitingAlarm { name: "nap".into() });
    if crash {
        sim.crash();
        rt.shutdown().await;
        sim.revive();
        rt = open().await;
    } else {
        rt.evict(&run_id).await;
    }
    rt.advance(Duration::from_secs(120)).await.expect("advance");
    let status = rt.status(&run_id).expect("status");
    let chunks = rt.stream_chunks(&run_id, 0, 100).expect("chunks");
    let shown = serde_json::to_value(rt.inspect(&run_id).expect("inspect")).expect("json");
    let counted = rt.metrics().stream_reemissions;
    rt.shutdown().await;
    let stream = chunks.iter().map(|c| c.data::<String>().expect("a string")).collect();
    (status, stream, (shown["reemissions"].clone(), counted))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fiber_re_entered_at_its_stash_repeats_no_chunk() {
    for crash in [false, true] {
        let (status, stream) = sleep_through(false, crash).await;
        assert!(matches!(status, RunStatus::Completed { .. }), "crash {crash}: {status:?}");
        assert_eq!(stream, ["a", "b", "c"], "crash {crash}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_entered_fiber_that_emits_another_chunk_keeps_the_durable_one_and_records_it() {
    // As after a deploy that reworded the chunk: the run goes on, the stream holds what a
    // reader may have seen, and the run's records say what the new code emitted instead.
    for crash in [false, true] {
        let (status, stream, (reemissions, counted)) =
            sleep_through_with(true, crash, RuntimeConfig::default()).await;
        assert!(matches!(status, RunStatus::Completed { .. }), "crash {crash}: {status:?}");
        assert_eq!(stream, ["a", "b", "c"], "crash {crash}: the durable chunk stands, once");
        let reemissions = reemissions.as_array().expect("a list").clone();
        assert_eq!(reemissions.len(), 1, "crash {crash}: {reemissions:?}");
        assert_eq!(
            (reemissions[0]["seq"].as_u64(), reemissions[0]["emitted"].as_str()),
            (Some(1), Some("B"))
        );
        if !crash {
            assert_eq!(counted, 1, "the counter of /metrics");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_strict_streams_a_re_entered_fiber_that_emits_another_chunk_is_escalated_with_its_place() {
    let config = RuntimeConfig { strict_streams: true, ..RuntimeConfig::default() };
    let (status, stream, _) = sleep_through_with(true, false, config).await;
    let RunStatus::Escalated { reason } = status else { panic!("not escalated: {status:?}") };
    assert!(reason.contains("chunk 1 differs") && reason.contains("AgentCheck"), "{reason}");
    assert_eq!(stream, ["a", "b"], "nothing of the other chunk reached the stream");
}
