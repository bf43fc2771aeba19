//! Duplicate webhook deliveries make one run: the provider's delivery id is the
//! idempotency key. Five concurrent deliveries of the same event return one handle; a
//! delivery that reuses the id with another body is refused with `KeyConflict`.
//!
//! Run: `cargo run -p durafiber-examples --example webhook_dedupe`

use durafiber::{ListFilter, RuntimeError};
use durafiber_examples::agents::{Event, InvoicePaid};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (rt, _dir) = durafiber_examples::fresh_runtime(|b| b.agent(InvoicePaid)).await?;
    let event = Event { invoice: "in_77".into(), cents: 5_000 };
    let deliveries: Vec<_> = (0..5)
        .map(|_| {
            let (rt, event) = (rt.clone(), event.clone());
            tokio::spawn(async move { rt.start::<InvoicePaid>("evt_1NqQ", &event).await })
        })
        .collect();
    for d in deliveries {
        let out = d.await??;
        println!("delivery -> run {} (accepted: {})", out.run_id, out.accepted);
    }
    let tampered = Event { cents: 9_999, ..event };
    match rt.start::<InvoicePaid>("evt_1NqQ", &tampered).await {
        Err(RuntimeError::KeyConflict { run_id, .. }) => {
            println!("same id, other body: refused (run {run_id})");
        }
        other => println!("unexpected: {other:?}"),
    }
    let runs = rt.list(&ListFilter { limit: 10, ..Default::default() })?.runs;
    println!("runs: {}", runs.len());
    rt.shutdown().await;
    Ok(())
}
