//! Child process of the recovery-accounting kill test: opens the runtime on DIR with a
//! virtual clock standing at NOW_MS. `start` starts one run and kills the process once its
//! fiber's stash is durable; `recover` lets the start-up scan re-enter the run, whose
//! recovery hook kills the process, and prints `ended <state> <reason>` if the run is
//! finished instead.

use std::time::Duration;

use durafiber_runtime::{Agent, AgentError, Ctx, Recovered, RunStatus, Runtime, clock::VirtualClock};
use durafiber_store::{Store, StoreConfig};

struct Doomed;

impl Agent for Doomed {
    const KIND: &'static str = "doomed";
    type Input = ();
    type Stash = u32;
    type Output = ();
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<(), AgentError> {
        ctx.stash("started", &1).await?;
        ctx.sleep_in_memory(Duration::from_secs(3600)).await;
        Ok(())
    }

    async fn on_fiber_recovered(&self, _: &mut Ctx<Self>, _: Recovered<Self>) -> Result<(), AgentError> {
        // The hook takes the whole process down, every time.
        std::process::abort();
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Err(e) = run(&args).await {
        eprintln!("hook-child: {e}");
        std::process::exit(1);
    }
}

async fn run(args: &[String]) -> Result<(), String> {
    let usage = "usage: hook-child DIR start|recover NOW_MS";
    let (dir, mode) = (args.get(1).ok_or(usage)?, args.get(2).ok_or(usage)?);
    let now_ms: u64 = args.get(3).and_then(|n| n.parse().ok()).ok_or(usage)?;
    let store = Store::open_at(dir, StoreConfig::default()).map_err(|e| e.to_string())?;
    let rt = Runtime::builder(store)
        .virtual_clock(VirtualClock::new(now_ms))
        .agent(Doomed)
        .open()
        .await
        .map_err(|e| e.to_string())?;
    if mode == "start" {
        let run = rt.start::<Doomed>("doomed", &()).await.map_err(|e| e.to_string())?.run_id;
        // The first process dies while its fresh fiber waits, after its stash is durable.
        for _ in 0..2_000 {
            if rt.inspect(&run).map_err(|e| e.to_string())?.stash.is_some() {
                println!("stashed");
                let _ = std::io::Write::flush(&mut std::io::stdout());
                std::process::abort();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        return Err("the fiber never stashed".into());
    }
    rt.advance(Duration::ZERO).await.map_err(|e| e.to_string())?;
    for run in rt.list(&Default::default()).map_err(|e| e.to_string())?.runs {
        match rt.wait(&run.run_id).await.map_err(|e| e.to_string())? {
            RunStatus::Escalated { reason } => println!("ended escalated {reason}"),
            other => println!("ended {}", other.name()),
        }
    }
    Ok(())
}
