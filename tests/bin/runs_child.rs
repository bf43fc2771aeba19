//! Child process of the runtime kill tests: opens the runtime on DIR and either starts
//! N `steps` runs (`start N`) or only recovers what is there (`recover`). Prints
//! `ack <run_id> <done>` after every acknowledged stash and `done <run_id> <steps>` when a
//! run completes; exits when every run is terminal.

use std::time::Duration;

use durafiber_demo::agents::{Steps, StepsInput};
use durafiber_runtime::{ListFilter, RunStatus, Runtime};
use durafiber_store::{Store, StoreConfig};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Err(e) = run(&args).await {
        eprintln!("runs-child: {e}");
        std::process::exit(1);
    }
}

async fn run(args: &[String]) -> Result<(), String> {
    let dir = args.get(1).ok_or("usage: runs-child DIR start N | recover")?;
    let store = Store::open_at(dir, StoreConfig::default()).map_err(|e| e.to_string())?;
    let runtime = Runtime::builder(store)
        .agent(Steps { print_acks: true, ..Steps::default() })
        .open()
        .await
        .map_err(|e| e.to_string())?;
    println!("ready");
    if args.get(2).map(String::as_str) == Some("start") {
        let n: u32 = args.get(3).and_then(|n| n.parse().ok()).ok_or("start needs N")?;
        for i in 0..n {
            let input = StepsInput { steps: 60, pause_ms: 3 };
            let out = runtime.start::<Steps>(&format!("job-{i}"), &input).await.map_err(|e| e.to_string())?;
            println!("started {}", out.run_id);
        }
    }
    let mut filter = ListFilter { limit: 1000, ..ListFilter::default() };
    loop {
        let page = runtime.list(&filter).map_err(|e| e.to_string())?;
        for run in &page.runs {
            let status = runtime.wait(&run.run_id).await.map_err(|e| e.to_string())?;
            match status {
                RunStatus::Completed { .. } => println!("done {}", run.run_id),
                other => println!("ended {} {}", run.run_id, other.name()),
            }
        }
        match page.next {
            Some(next) => filter.after = Some(next),
            None => break,
        }
    }
    runtime.shutdown().await;
    tokio::time::sleep(Duration::from_millis(1)).await;
    Ok(())
}
