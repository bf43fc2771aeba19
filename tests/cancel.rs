//! The cooperative cancel (§2.3): a fiber that never asks whether it was cancelled is stopped
//! at its next boundary — a stash, an effect, a durable wait or sleep, `emit_sync` — which
//! returns `AgentError::Cancelled`, and the run ends `Cancelled` there with the caller's
//! reason. Nothing after the cancel reaches the store or the upstream.

use durafiber_runtime::Timestamp;
use std::{
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use durafiber_runtime::{Agent, AgentError, Ctx, Recovered, RunStatus, Runtime, clock::VirtualClock};
use durafiber_store::{SimBackend, Store, StoreConfig};

/// Works in rounds of one second, each ending with the boundary its input names, and never
/// looks at the cancellation signal. Counts the calls its effects make.
struct Stubborn {
    calls: Arc<AtomicU32>,
}

impl Stubborn {
    async fn rounds(&self, ctx: &mut Ctx<Self>, boundary: &str, from: u32) -> Result<u32, AgentError> {
        for round in from.. {
            ctx.sleep_in_memory(Duration::from_secs(1)).await;
            match boundary {
                "stash" => ctx.stash("round", &round).await?,
                "effect" => {
                    let calls = self.calls.clone();
                    ctx.effect(&format!("call:{round}"), round, move |_key, n| {
                        calls.fetch_add(1, Ordering::SeqCst);
                        async move { Ok::<u32, String>(n) }
                    })
                    .await?;
                }
                "sleep" => ctx.sleep_for(&format!("nap:{round}"), Duration::from_millis(1)).await?,
                "event" => {
                    ctx.wait_for_event::<u32>(&format!("tick:{round}"), Some(Duration::from_millis(1)))
                        .await?;
                }
                _ => {
                    ctx.emit_sync(&round).await?;
                }
            }
        }
        Ok(0)
    }
}

impl Agent for Stubborn {
    const KIND: &'static str = "stubborn";
    type Input = String;
    type Stash = u32;
    type Output = u32;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, boundary: String) -> Result<u32, AgentError> {
        self.rounds(ctx, &boundary, 0).await
    }

    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, r: Recovered<Self>) -> Result<u32, AgentError> {
        self.rounds(ctx, &r.input, r.stash.unwrap_or(0)).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fiber_that_never_asks_is_cancelled_at_its_next_boundary() {
    let calls = Arc::new(AtomicU32::new(0));
    let store = Store::with_backend(Arc::new(SimBackend::new()), StoreConfig::default()).expect("store");
    let rt = Runtime::builder(store)
        .virtual_clock(VirtualClock::new(Timestamp::from_millis(1_000_000_000)))
        .agent(Stubborn { calls: calls.clone() })
        .open()
        .await
        .expect("runtime");
    for boundary in ["stash", "effect", "sleep", "event", "emit_sync"] {
        let run_id = rt.start::<Stubborn>(boundary, &boundary.to_string()).await.expect("start").run_id;
        rt.advance(Duration::from_millis(3_500)).await.expect("advance");
        // In its in-memory pause: the fiber is executing, so the cancel is a request.
        rt.cancel(&run_id, "no longer needed").await.expect("cancel");
        let calls_at_cancel = calls.load(Ordering::SeqCst);
        let chunks_at_cancel = rt.stream_chunks(&run_id, 0, 100).expect("chunks").len();
        rt.advance(Duration::from_secs(5)).await.expect("advance");
        assert_eq!(
            rt.status(&run_id).expect("status"),
            RunStatus::Cancelled { reason: "no longer needed".into() },
            "{boundary}"
        );
        assert_eq!(
            calls.load(Ordering::SeqCst),
            calls_at_cancel,
            "{boundary}: an effect started after the cancel"
        );
        assert_eq!(rt.stream_chunks(&run_id, 0, 100).expect("chunks").len(), chunks_at_cancel, "{boundary}");
    }
    rt.shutdown().await;
}
